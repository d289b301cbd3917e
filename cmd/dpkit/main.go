// Command dpkit runs device plugins, an emulated kubelet device manager,
// extended-resource advertisers and virtual nodes. See the README.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dpkit/dpkit/internal/cli/app"
)

func main() {
	// A closed output pipe ("dpkit up | head") makes writes fail with
	// EPIPE instead of killing the process, which would leave a temporary
	// root and running plugins behind. Children keep the default.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		code := app.ExitCode(err)
		if code != app.ExitBrokenPipe {
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(code)
	}
}
