// Command controlplane starts the test control plane (etcd, kube-apiserver,
// kube-scheduler and kube-controller-manager, built by
// hack/build-controlplane.sh) and keeps it running until interrupted, so
// dpkit node, dpkit advertise and DRA drivers can be tried without a
// cluster. hack/cluster.sh builds what is missing and runs it:
//
//	bash hack/cluster.sh
//
// With --node it also starts a real node (a kubelet on containerd and
// runc, built by hack/build-node.sh; root only), on which DaemonSets run:
//
//	sudo bash hack/cluster.sh --node
//
// It prints, as shell exports, the administrator's kubeconfig, the CA that
// signs the API server's kubelet client certificate (the --client-ca-file
// of a node), the directory of kubectl v1.37.0, and with --node the node's
// name, kubelet root, containerd socket and ctr; --env-file writes them to
// a file once everything runs. Ctrl-C stops everything, restores the host
// settings the node changed, and removes the directory, logs included,
// unless DPKIT_CONTROLPLANE_KEEP is set.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/dpkit/dpkit/internal/fileutil"
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
	controllers := flag.Bool("controller-manager", true, "also start kube-controller-manager: the controllers of a cluster (ResourceClaims released, namespaces emptied, DaemonSets rolled); always with --node")
	envFile := flag.String("env-file", "", "write the export lines to this file once everything runs (for scripts: wait for it, then source it); removed on exit")
	node := flag.Bool("node", false, "also start a real node: kubelet, containerd and runc (needs root and hack/build-node.sh)")
	flag.Parse()
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: the flags are --scheduler, --controller-manager and --node", flag.Args())
	}
	if *node && !*scheduler {
		return fmt.Errorf("--node needs kube-scheduler: drop --scheduler=false")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cp, err := controlplane.Start(ctx, controlplane.Options{Scheduler: *scheduler, ControllerManager: *controllers || *node, Logger: log})
	if err != nil {
		return err
	}
	env := fmt.Sprintf("export KUBECONFIG=%s\nexport CLIENT_CA=%s\n", cp.Kubeconfig, cp.ClientCAFile)
	if cp.Kubectl != "" {
		env += fmt.Sprintf("export PATH=%s:$PATH  # kubectl %s\n", filepath.Dir(cp.Kubectl), controlplane.Version)
	}
	if *node {
		n, err := cp.StartNode(ctx, controlplane.NodeOptions{})
		if err != nil {
			return errors.Join(err, cp.Stop())
		}
		env += fmt.Sprintf("export NODE=%s KUBELET_ROOT=%s CONTAINERD_ADDRESS=%s CTR=%s\n# images: %s, %s; import more with: $CTR --address $CONTAINERD_ADDRESS -n k8s.io images import FILE\n",
			n.Name, n.KubeletRoot, n.ContainerdSocket, n.Binary("ctr"), controlplane.PauseImage, controlplane.BusyboxImage)
	}
	fmt.Print(env)
	if *envFile != "" {
		// Written once everything runs, so a script may wait for it and
		// source it; removed when the cluster stops.
		if err := fileutil.WriteAtomic(*envFile, []byte(env), 0o600); err != nil {
			return errors.Join(err, cp.Stop())
		}
		defer os.Remove(*envFile)
	}
	fmt.Printf("# logs in %s; Ctrl-C stops it\n", cp.Dir)
	<-ctx.Done()
	return cp.Stop()
}
