package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// RunFunc runs a command line: Run, or dpkit-cluster's.
type RunFunc func(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) error

// Main is the whole main function of a dpkit binary: it runs run with the
// process's arguments and streams until Ctrl-C or SIGTERM, prints its
// error and exits with the code the command contract gives it.
func Main(run RunFunc) {
	// A closed output pipe ("dpkit up | head") makes writes fail with
	// EPIPE instead of killing the process, which would leave a temporary
	// root and running plugins behind. Children keep the default.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err == nil {
		return
	}
	code := ExitCode(err)
	// Nothing to say when the reader of the output went away, or when
	// dpkit-cluster already said why it failed.
	if code != ExitBrokenPipe && !Reported(err) {
		fmt.Fprintln(os.Stderr, "error:", err)
	}
	os.Exit(code)
}
