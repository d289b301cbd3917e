//go:build dpkit_lean

package app

import (
	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/plugin"
	"github.com/dpkit/dpkit/internal/cli/versioncmd"
)

// subcommands of the lean build: a device plugin DaemonSet needs only
// "dpkit plugin". Leaving out the Kubernetes client libraries roughly
// halves the process's resident memory (docs/performance.md).
var subcommands = []func(*cli.Env) *cobra.Command{
	versioncmd.NewCommand,
	plugin.NewCommand,
}
