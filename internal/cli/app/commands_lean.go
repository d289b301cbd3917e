//go:build dpkit_lean

package app

import (
	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/deviceclass"
	"github.com/dpkit/dpkit/internal/cli/exporter"
	"github.com/dpkit/dpkit/internal/cli/plugin"
	"github.com/dpkit/dpkit/internal/cli/versioncmd"
)

// baseCommands of the lean build: a device plugin DaemonSet needs only
// "dpkit plugin" (and "dpkit deviceclass" for its config's DeviceClasses,
// "dpkit exporter" for the devices pods hold, which needs no API types). Leaving out the Kubernetes client libraries roughly
// halves the process's resident memory (docs/performance.md).
func baseCommands(*dispatcher) []func(*cli.Env) *cobra.Command {
	return []func(*cli.Env) *cobra.Command{
		versioncmd.NewCommand,
		plugin.NewCommand,
		deviceclass.NewCommand,
		exporter.NewCommand,
	}
}
