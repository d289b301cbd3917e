package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// FlagError is a cobra FlagErrorFunc: a flag cobra cannot parse (unknown,
// or a value of the wrong type) is a usage error, exit status 2, that
// points to --help. Commands set it with cmd.SetFlagErrorFunc(FlagError).
func FlagError(cmd *cobra.Command, err error) error {
	return Exit(2, fmt.Errorf("%w (see %s --help)", err, cmd.CommandPath()))
}
