// Command dpkit runs device plugins, an emulated kubelet device manager,
// extended-resource advertisers and virtual nodes. See the README. The
// commands that need the Kubernetes client libraries (node, advertise, get
// --kubeconfig) are in dpkit-cluster, which dpkit runs for them.
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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := app.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !app.Reported(err) { // dpkit-cluster said why itself
			fmt.Fprintln(os.Stderr, "error:", err)
		}
		os.Exit(app.ExitCode(err))
	}
}
