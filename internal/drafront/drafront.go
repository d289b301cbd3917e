// Package drafront starts the DRA front of a plugin's resource (pkg/draplugin)
// with an API server client: what "dpkit plugin" runs for a resource whose
// fronts include dra. It is linked only into dpkit-cluster, since it needs
// client-go; dpkit hands such command lines over to dpkit-cluster.
package drafront

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	kubeconfigpkg "github.com/dpkit/dpkit/internal/kubeconfig"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/pkg/draplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// New returns the DRA front starter of dpkit-cluster. The API client is
// made once, from the first resource's kubeconfig setting, and shared by
// every resource of the process.
func New() pluginrun.DRAFront {
	var (
		once  sync.Once
		start pluginrun.DRAFront
		err   error
	)
	return func(inv *inventory.Inventory, o pluginrun.DRAOptions, log *slog.Logger, reg prometheus.Registerer) (pluginrun.DRADriver, error) {
		once.Do(func() {
			rc, e := kubeconfigpkg.Load(o.Kubeconfig)
			if e != nil {
				err = fmt.Errorf("the DRA front needs the API server: %w", e)
				return
			}
			var client kubernetes.Interface
			if client, err = kubernetes.NewForConfig(rc); err == nil {
				start = WithClient(client)
			}
		})
		if err != nil {
			return pluginrun.DRADriver{}, err
		}
		return start(inv, o, log, reg)
	}
}

// WithClient returns a DRA front starter whose fronts all use client
// (DRAOptions.Kubeconfig is not read): what dpkit node gives the
// in-process plugins of its nodes, with the client the nodes share.
//
// Fronts started with DRAOptions.FollowAllocated (dpkit node's in-process
// plugins, for a resource the device plugin front serves too) follow the
// claims allocated from their pools through one informer
// (draplugin.AllocatedClaims), shared by every front of the process.
func WithClient(client kubernetes.Interface) pluginrun.DRAFront {
	var (
		once      sync.Once
		allocated *draplugin.AllocatedClaims
	)
	return func(inv *inventory.Inventory, o pluginrun.DRAOptions, log *slog.Logger, reg prometheus.Registerer) (pluginrun.DRADriver, error) {
		var follow *draplugin.AllocatedClaims
		if o.FollowAllocated && !o.Retired {
			once.Do(func() { allocated = draplugin.NewAllocatedClaims(client, log) })
			follow = allocated
		}
		if o.NodeName == "" {
			return pluginrun.DRADriver{}, fmt.Errorf("the DRA front of %s needs the node's name: set dra.nodeName in the config or $NODE_NAME (in a DaemonSet, from the downward API: fieldPath spec.nodeName)", inv.Resource())
		}
		d, err := draplugin.New(draplugin.Config{
			DriverName:  o.DriverName,
			NodeName:    o.NodeName,
			PluginsDir:  o.PluginsDir,
			RegistryDir: o.RegistryDir,
			CDIDir:      o.CDIDir,
			SysfsRoot:   o.SysfsRoot,
			Client:      client,
			PodUID:      types.UID(o.PodUID),
			Retired:     o.Retired,
			Allocated:   follow,
			Logger:      log,
			Registerer:  reg,
		}, inv)
		if err != nil {
			return pluginrun.DRADriver{}, err
		}
		if o.Retired && d.PreparedClaims() == 0 {
			return pluginrun.DRADriver{}, nil // nothing to keep
		}
		run := func(ctx context.Context) error {
			if !waitNode(ctx, client, o.NodeName, log) {
				return nil // stopped while waiting
			}
			return d.Run(ctx)
		}
		return pluginrun.DRADriver{Run: run, Ready: d.Ready}, nil
	}
}

// nodePoll is how often waitNode asks for a Node that is not there yet.
const nodePoll = time.Second

// waitNode returns once the API server has the Node the front publishes
// for (its ResourceSlices are owned by it, and the upstream helper fails
// to publish until it exists), or at once when the Node cannot be read
// for another reason (the helper then says why). A kubelet registers its
// Node before its plugins run; "dpkit up" and scripts may not, so the
// wait is said once, with the fix. It returns false when ctx ended first.
func waitNode(ctx context.Context, c kubernetes.Interface, node string, log *slog.Logger) bool {
	warned := false
	tick := time.NewTicker(nodePoll)
	defer tick.Stop()
	for {
		_, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			if warned && err == nil {
				log.Info("The node is on the API server; serving the DRA front", "node", node)
			}
			return true
		}
		if !warned {
			log.Warn("Waiting for the node to be on the API server before serving the DRA front: its ResourceSlices are owned by the Node", "node", node,
				"fix", "create the Node, or name one that exists (dra.nodeName, $NODE_NAME, or dpkit up --node-name)")
			warned = true
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return false
		}
	}
}
