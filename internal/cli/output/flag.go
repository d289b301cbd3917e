package output

import "github.com/spf13/cobra"

// Formats lists the formats -o accepts.
func Formats() []string { return []string{Table, JSON, YAML} }

// AddFlag adds -o/--output to cmd, stored in p (default table), with shell
// completion of the formats. Check the value with Check.
func AddFlag(cmd *cobra.Command, p *string) {
	cmd.Flags().StringVarP(p, "output", "o", Table, "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(Formats(), cobra.ShellCompDirectiveNoFileComp))
}
