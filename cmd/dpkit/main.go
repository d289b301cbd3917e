// Command dpkit runs device plugins, an emulated kubelet device manager and
// the conformance checker; for the commands that talk to a cluster it runs
// dpkit-cluster. See the README.
package main

import (
	"context"
	"io"

	"github.com/dpkit/dpkit/internal/cli/app"
)

func main() {
	app.Main(func(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) error {
		return app.Run(ctx, args, in, out, errOut)
	})
}
