// Package cli holds what every dpkit subcommand shares: its input and output
// streams, the logger and the errors that carry an exit code.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
)

// Env is handed to every subcommand constructor. Subcommands write their
// results to Out, diagnostics to Err and logs through Logger; none of them
// touches os.Stdout, os.Stderr or os.Exit directly.
type Env struct {
	In     io.Reader
	Out    io.Writer
	Err    io.Writer
	Logger *slog.Logger
	// Cluster reads from API servers; nil in the dpkit binary, which runs
	// dpkit-cluster for the command lines that need it.
	Cluster Cluster
}

// ExitInterrupted is the exit code of a run interrupted by Ctrl-C or
// SIGTERM, the shell's 128 + SIGINT.
const ExitInterrupted = 130

// ExitError is an error that asks for a particular process exit code.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *ExitError) Unwrap() error { return e.Err }

// Exit wraps err so that the process exits with code.
func Exit(code int, err error) error { return &ExitError{Code: code, Err: err} }

// ExitCode returns the exit code err asks for: 0 for nil, the code of an
// ExitError in its chain, and 1 otherwise.
func ExitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		return ee.Code
	}
	return 1
}
