package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// FlagError is a cobra FlagErrorFunc: a flag cobra cannot parse (unknown,
// or a value of the wrong type) is a usage error, exit status 2, that
// points to --help. The root command sets it for every command; a command
// run on its own (in its package's tests) sets it with
// cmd.SetFlagErrorFunc(FlagError).
func FlagError(cmd *cobra.Command, err error) error {
	return UsageError(WithHelp(err, cmd.CommandPath()))
}

// WithHelp returns err followed by where to read the usage of command,
// on a line of its own: "See 'dpkit up --help'.".
func WithHelp(err error, command string) error { return &helpHint{err: err, command: command} }

// HasHelp reports whether err already says where to read the usage.
func HasHelp(err error) bool {
	var h *helpHint
	return errors.As(err, &h)
}

type helpHint struct {
	err     error
	command string
}

func (h *helpHint) Error() string { return h.err.Error() + "\nSee '" + h.command + " --help'." }

func (h *helpHint) Unwrap() error { return h.err }
