// Package cli holds what every dpkit subcommand shares: its input and output
// streams, the logger and the errors that carry an exit code.
package cli

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// Env is handed to every subcommand constructor. Subcommands write their
// results to Out, diagnostics to Err and logs through Logger; none of them
// touches os.Stdout, os.Stderr or os.Exit directly.
type Env struct {
	In     io.Reader
	Out    io.Writer
	Err    io.Writer
	Logger *slog.Logger
	// Getenv reads an environment variable; nil means os.Getenv. Tests
	// set it instead of changing the process's environment.
	Getenv func(string) string
	// Cluster reads from API servers; nil in the dpkit binary, which runs
	// dpkit-cluster for the command lines that need it.
	Cluster Cluster
	// HandOver runs dpkit-cluster with the whole command line, for a
	// command that finds it needs Cluster only once it has read its input
	// (dpkit plugin with a config that has the dra front); nil where
	// Cluster is set.
	HandOver func(cmd *cobra.Command) error
}

// Var returns the environment variable key, read through Getenv.
func (e *Env) Var(key string) string {
	if e.Getenv == nil {
		return os.Getenv(key)
	}
	return e.Getenv(key)
}

// ExitUsage is the exit code of a usage error: an unknown command or
// flag, a wrong number of arguments, a bad flag value.
const ExitUsage = 2

// UsageError wraps err so that the process exits with ExitUsage.
func UsageError(err error) error { return Exit(ExitUsage, err) }

// UsageErrorf formats a usage error.
func UsageErrorf(format string, args ...any) error {
	return UsageError(fmt.Errorf(format, args...))
}

// ServerAnnotation marks a command that serves until it is stopped
// (dpkit up, kubelet, plugin, node): a signal is how it is meant to end,
// so it exits 0 after a clean stop rather than ExitInterrupted. Its value
// is "true", or the name of the boolean flag that makes the command a
// server ("--watch").
const ServerAnnotation = "dpkit.io/server"

// ExitInterrupted is the exit code of a run interrupted by Ctrl-C or
// SIGTERM, the shell's 128 + SIGINT.
const ExitInterrupted = 130

// ExitBrokenPipe is the exit code of a command whose output's reader went
// away before it finished ("dpkit get pods | head -1"), the shell's 128 +
// SIGPIPE. Nothing is printed for it.
const ExitBrokenPipe = 141

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
