// Command dpkit-cluster is dpkit with the commands that need the
// Kubernetes client libraries: dpkit node, dpkit advertise and dpkit get
// --kubeconfig, besides every other. dpkit runs it for those commands
// when it is next to dpkit or on PATH; the container image ships it as
// /usr/bin/dpkit. See docs/architecture.md, "Two binaries".
package main

import (
	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/cli/app/cluster"
)

func main() { app.Main(cluster.Run) }
