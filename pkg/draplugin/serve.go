package draplugin

import (
	"context"
	"fmt"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// DefaultPodResourcesSocket is the kubelet's PodResources socket, which
// Serve reads to learn when device plugin containers have released their
// devices.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Serve serves plugin p for resource through both of the kubelet's device
// APIs until ctx ends: the device plugin API (dpCfg, as deviceplugin.Serve)
// and DRA (cfg), from one inventory that never gives a device to both. When
// cfg has no Client, the driver talks to the API server of the pod Serve
// runs in (its service account needs what deploy/components/dra grants). The PodResources socket is DefaultPodResourcesSocket unless
// podResources names another.
func Serve(ctx context.Context, dpCfg deviceplugin.Config, cfg Config, resource string, p deviceplugin.Plugin, podResources ...string) error {
	if cfg.Client == nil {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return fmt.Errorf("DRA driver %s: no Client set and not in a pod: %w", cfg.DriverName, err)
		}
		if cfg.Client, err = kubernetes.NewForConfig(rc); err != nil {
			return err
		}
	}
	socket := DefaultPodResourcesSocket
	if len(podResources) > 0 {
		socket = podResources[0]
	}
	lister, conn, err := prclient.New(socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	inv := inventory.New(resource, p, cfg.Logger, inventory.WithPodResources(lister))
	drv, err := New(cfg, inv)
	if err != nil {
		return err
	}
	srv, err := deviceplugin.NewServer(dpCfg, deviceplugin.Resource{Name: resource, Plugin: inv.DevicePluginFront()})
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return inv.Run(ctx) })
	g.Go(func() error { return drv.Run(ctx) })
	g.Go(func() error { return srv.Run(ctx) })
	return g.Wait()
}
