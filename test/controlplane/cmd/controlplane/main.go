// Command controlplane starts the test control plane (etcd, kube-apiserver
// and kube-scheduler, built by hack/build-controlplane.sh) and keeps it
// running until interrupted, so dpkit node and dpkit advertise can be tried
// without a cluster:
//
//	bash hack/build-controlplane.sh
//	go run ./test/controlplane/cmd/controlplane
//
// It prints, as shell assignments, the administrator's kubeconfig and the
// CA that signs the API server's kubelet client certificate (the
// --client-ca-file of a node). The control plane's directory, with its
// logs, is removed on exit unless DPKIT_CONTROLPLANE_KEEP is set.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/dpkit/dpkit/test/controlplane"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "controlplane:", err)
		os.Exit(1)
	}
}

func run() error {
	scheduler := flag.Bool("scheduler", true, "also start kube-scheduler")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: the only flag is --scheduler", flag.Args())
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cp, err := controlplane.Start(ctx, controlplane.Options{Scheduler: *scheduler, Logger: log})
	if err != nil {
		return err
	}
	fmt.Printf("export KUBECONFIG=%s\nCLIENT_CA=%s\n# logs in %s; Ctrl-C stops it\n", cp.Kubeconfig, cp.ClientCAFile, cp.Dir)
	<-ctx.Done()
	return cp.Stop()
}
