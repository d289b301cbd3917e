// Package cluster assembles dpkit-cluster: every dpkit command, with the
// ones that need the Kubernetes client libraries (node, advertise, get
// --kubeconfig) run in process. dpkit itself runs dpkit-cluster for those,
// so that the dpkit binary builds without client-go, virtual-kubelet and
// the apiserver libraries (docs/architecture.md, "Two binaries").
package cluster

import (
	"context"
	"io"

	"github.com/dpkit/dpkit/internal/cli/advertise"
	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/cli/node"
)

// Options are the app options of dpkit-cluster: the real node and
// advertise commands, and API server access for get --kubeconfig.
func Options() []app.Option {
	return []app.Option{
		app.WithCommands(advertise.NewCommand, node.NewCommand),
		app.WithCluster(kubeClients{}),
	}
}

// Run executes a dpkit-cluster command line, as app.Run does for dpkit.
func Run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) error {
	return app.Run(ctx, args, in, out, errOut, Options()...)
}
