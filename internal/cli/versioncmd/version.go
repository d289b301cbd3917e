// Package versioncmd implements "dpkit version".
package versioncmd

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/version"
)

// NewCommand returns the "version" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the dpkit version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			return output.Write(env.Out, format, info, func(t *tabwriter.Writer) error {
				_, err := fmt.Fprintf(t, "dpkit %s (%s, %s)\n", info.Version, info.GoVersion, info.Platform)
				return err
			})
		},
	}
	output.AddFlag(cmd, &format)
	return cmd
}
