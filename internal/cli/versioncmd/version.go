// Package versioncmd implements "dpkit version".
package versioncmd

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/version"
)

// NewCommand returns the "version" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the dpkit version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			switch output {
			case "":
				fmt.Fprintf(env.Out, "dpkit %s (%s, %s)\n", info.Version, info.GoVersion, info.Platform)
				return nil
			case "json":
				enc := json.NewEncoder(env.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			default:
				return fmt.Errorf("--output: unknown format %q; use json or leave it empty", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: empty for text, or json")
	return cmd
}
