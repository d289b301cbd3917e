//go:build !dpkit_lean

package app

import (
	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/admit"
	"github.com/dpkit/dpkit/internal/cli/deletecmd"
	"github.com/dpkit/dpkit/internal/cli/deviceclass"
	"github.com/dpkit/dpkit/internal/cli/exporter"
	"github.com/dpkit/dpkit/internal/cli/get"
	"github.com/dpkit/dpkit/internal/cli/kubelet"
	"github.com/dpkit/dpkit/internal/cli/plugin"
	"github.com/dpkit/dpkit/internal/cli/up"
	"github.com/dpkit/dpkit/internal/cli/verify"
	"github.com/dpkit/dpkit/internal/cli/versioncmd"
)

// baseCommands lists the constructors of dpkit's subcommands. advertise
// and node are stand-ins that run dpkit-cluster, which has the Kubernetes
// client libraries they need (cluster.go; cmd/dpkit-cluster puts the real
// ones in their place). The lean build (-tags dpkit_lean,
// commands_lean.go) keeps only what a plugin DaemonSet runs.
func baseCommands(d *dispatcher) []func(*cli.Env) *cobra.Command {
	return []func(*cli.Env) *cobra.Command{
		versioncmd.NewCommand,
		plugin.NewCommand,
		deviceclass.NewCommand,
		kubelet.NewCommand,
		get.NewCommand,
		deletecmd.NewCommand,
		admit.NewCommand,
		up.NewCommand,
		d.clusterCommand("advertise", "Advertise extended resources on a node"),
		d.clusterCommand("node", "Run a virtual node: registers with the API server, embeds a device manager and runs pods"),
		verify.NewCommand,
		exporter.NewCommand,
	}
}
