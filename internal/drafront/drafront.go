// Package drafront starts the DRA front of a plugin's resource (pkg/draplugin)
// with an API server client: what "dpkit plugin" runs for a resource whose
// fronts include dra. It is linked only into dpkit-cluster, since it needs
// client-go; dpkit hands such command lines over to dpkit-cluster.
package drafront

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
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
		once   sync.Once
		client kubernetes.Interface
		err    error
	)
	return func(inv *inventory.Inventory, o pluginrun.DRAOptions, log *slog.Logger, reg prometheus.Registerer) (pluginrun.DRADriver, error) {
		once.Do(func() {
			rc, e := kubeconfigpkg.Load(o.Kubeconfig)
			if e != nil {
				err = fmt.Errorf("the DRA front needs the API server: %w", e)
				return
			}
			client, err = kubernetes.NewForConfig(rc)
		})
		if err != nil {
			return pluginrun.DRADriver{}, err
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
			Logger:      log,
			Registerer:  reg,
		}, inv)
		if err != nil {
			return pluginrun.DRADriver{}, err
		}
		return pluginrun.DRADriver{Run: d.Run, Ready: d.Ready}, nil
	}
}
