// Package devicehost runs what a kubelet runs for device plugins, rooted at
// one directory: the device manager (registration on
// <root>/device-plugins/kubelet.sock, accounting, admission, checkpoint),
// the plugin watcher on <root>/plugins_registry, and the PodResources API
// server. The emulated kubelet (dpkit kubelet, dpkit up) and the virtual
// node (dpkit node) are both built on it.
package devicehost

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/podresources"
)

// Config configures a Host.
type Config struct {
	// Root stands for the kubelet's root directory.
	Root string
	// Logger receives every component's logs, each with a "component"
	// attribute. Default: discard.
	Logger *slog.Logger
	// TopologyPolicy, TopologyScope and NUMANodes are passed to the device
	// manager (devicemanager.Config).
	TopologyPolicy string
	TopologyScope  string
	NUMANodes      []int
	// GracePeriod is the device manager's grace period for resources
	// whose plugins are all gone (devicemanager.Config.GracePeriod).
	// Default 5m, the kubelet's.
	GracePeriod time.Duration
}

// Host is a started device manager, plugin watcher and PodResources
// server. Create it with New, Start it, and Stop it when done.
type Host struct {
	// Manager is the device manager; admit pods through it.
	Manager *devicemanager.Manager
	// Watcher is the plugin watcher, set by Start.
	Watcher *pluginwatcher.Watcher
	// PodResources is the PodResources server, set by Start; serve it
	// with Serve or ServeListener on podresources.SocketPath(Root).
	PodResources *podresources.Server

	cfg Config
	log *slog.Logger
}

// New validates cfg and creates the device manager, which callers may
// need before Start (a pods provider that admits through it, say).
func New(cfg Config) (*Host, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mgr, err := devicemanager.New(devicemanager.Config{
		Root:           cfg.Root,
		Logger:         log.With("component", "devicemanager"),
		TopologyPolicy: cfg.TopologyPolicy,
		TopologyScope:  cfg.TopologyScope,
		NUMANodes:      cfg.NUMANodes,
		GracePeriod:    cfg.GracePeriod,
	})
	if err != nil {
		return nil, err
	}
	return &Host{Manager: mgr, cfg: cfg, log: log}, nil
}

// Start starts the device manager, drops restored allocations of pods not
// in active (as the kubelet does for pods it no longer runs), and starts
// the plugin watcher. pods answers the PodResources API's questions about
// pods. The components run until ctx ends or Stop is called.
func (h *Host) Start(ctx context.Context, pods podresources.PodsProvider, active []types.UID) error {
	if err := h.Manager.Start(ctx); err != nil {
		return err
	}
	h.Manager.RetainPods(active)
	// With an unreadable checkpoint, the devices of the pods still running
	// are unknown: hold their resources back until they are gone.
	h.Manager.HoldUnknown(podsIn(pods.GetActivePods(), active))
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      filepath.Join(h.cfg.Root, "plugins_registry"),
		Logger:   h.log.With("component", "pluginwatcher"),
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DevicePlugin: h.Manager.PluginHandler()},
	})
	if err == nil {
		h.PodResources, err = podresources.NewServer(podresources.Config{
			Providers: podresources.Providers{Pods: pods, Devices: h.Manager},
			Logger:    h.log.With("component", "podresources"),
		})
	}
	if err == nil {
		err = w.Start(ctx)
	}
	if err != nil {
		h.Manager.Stop()
		return err
	}
	h.Watcher = w
	return nil
}

// podsIn returns the pods whose UID is in uids.
func podsIn(pods []*corev1.Pod, uids []types.UID) []*corev1.Pod {
	keep := make(map[types.UID]bool, len(uids))
	for _, u := range uids {
		keep[u] = true
	}
	var out []*corev1.Pod
	for _, p := range pods {
		if keep[p.UID] {
			out = append(out, p)
		}
	}
	return out
}

// PodResourcesSocket is where the PodResources API is served.
func (h *Host) PodResourcesSocket() string { return podresources.SocketPath(h.cfg.Root) }

// Stop waits for the plugin watcher, which ends with the context given to
// Start, and stops the device manager. Cancel that context first.
func (h *Host) Stop() {
	if h.Watcher != nil {
		<-h.Watcher.Done()
	}
	h.Manager.Stop()
}
