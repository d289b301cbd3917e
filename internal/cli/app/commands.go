//go:build !dpkit_lean

package app

import (
	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/admit"
	"github.com/dpkit/dpkit/internal/cli/advertise"
	"github.com/dpkit/dpkit/internal/cli/deletecmd"
	"github.com/dpkit/dpkit/internal/cli/get"
	"github.com/dpkit/dpkit/internal/cli/kubelet"
	"github.com/dpkit/dpkit/internal/cli/node"
	"github.com/dpkit/dpkit/internal/cli/plugin"
	"github.com/dpkit/dpkit/internal/cli/up"
	"github.com/dpkit/dpkit/internal/cli/verify"
	"github.com/dpkit/dpkit/internal/cli/versioncmd"
)

// subcommands lists the constructors of dpkit's subcommands. The lean
// build (-tags dpkit_lean, commands_lean.go) keeps only what a plugin
// DaemonSet runs.
var subcommands = []func(*cli.Env) *cobra.Command{
	versioncmd.NewCommand,
	plugin.NewCommand,
	kubelet.NewCommand,
	get.NewCommand,
	deletecmd.NewCommand,
	admit.NewCommand,
	up.NewCommand,
	advertise.NewCommand,
	node.NewCommand,
	verify.NewCommand,
}
