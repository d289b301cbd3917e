// Package devicehost is the kubelet side of one node, assembled once and
// rooted at one directory: the device manager (registration on
// <root>/device-plugins/kubelet.sock, accounting, admission, checkpoint),
// the plugin watcher on <root>/plugins_registry with the handlers of the
// managers, the PodResources API served on
// <root>/pod-resources/kubelet.sock, and the pods the node runs. The
// emulated kubelet (internal/emulator: dpkit kubelet, dpkit up) and the
// virtual node (pkg/virtualnode: dpkit node) are thin users of it.
//
// # Pods
//
// Host.Pods is the host's one pod store, as the kubelet's pod manager: one
// pod per namespace and name, terminated pods kept until removed. The
// PodResources API answers from it, the emulated kubelet adds the pods it
// admits and the virtual node's provider keeps there the last state of
// every pod the API server gave it.
//
// # The DRA manager
//
// The kubelet runs the device manager beside the DRA manager, and so does
// the host: each manager is a field set up by New, started by Start in the
// kubelet's order and stopped by Stop in reverse. The DRA manager
// (pkg/dramanager) plugs into the places the device manager uses: its
// plugin handler is in the watcher's Handlers map under
// pluginwatcher.DRAPlugin beside pluginwatcher.DevicePlugin, and it is
// the PodResources server's DynamicResources provider beside Devices. Its
// claims come from Config.Claims; its reconcile loop unprepares the
// claims of pods that leave Pods' active pods.
//
// # Admitting a pod
//
// The host is also the kubelet's container manager's face for pods, the
// one admission path of every node kind: AdmitPod (the device manager's
// allocation with the topology policy, then the DRA manager's preparation,
// both rolled back when preparation fails), or AllocateDevices and
// PrepareDynamicResources for a caller that keeps a pod waiting for its
// claims; ContainerResources, per container, what the runtime gets, merged
// in the kubelet's order (GetResources); ReleasePod, ReleaseDevices and
// UnprepareDynamicResources when the pod ends or is removed. The emulated
// kubelet and the virtual node call these and import neither manager.
// Like the kubelet's container manager, the host admits but keeps no
// record of admissions beyond the managers' own: Pods is what the caller
// stores.
//
// The package keeps its name: its users and the differential tests know
// it, and a DRA manager is a device resource manager too.
package devicehost

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/dramanager"
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
	// AdmissionWait holds a pod's admission while a resource it requests
	// is known but its plugin does not serve it yet, up to this long
	// (devicemanager.Config.AdmissionWait). Zero refuses at once, as the
	// kubelet.
	AdmissionWait time.Duration
	// Claims gives the DRA manager the ResourceClaims of the pods it
	// prepares (dramanager.Config.Claims). Nil: DRA drivers register,
	// but a pod with claims cannot be prepared, and says so.
	Claims ClaimGetter
	// Slices wipes the ResourceSlices of the node's DRA drivers: all at
	// Start, and a driver's once it stays unusable for WipingDelay
	// (dramanager.Config.Slices). Nil wipes nothing.
	Slices SliceWiper
	// WipingDelay is dramanager.Config.WipingDelay. Default 30s, the
	// kubelet's.
	WipingDelay time.Duration
	// Registerer, when set, receives the kubelet's DRA metrics
	// (dramanager.Config.Registerer) and PodResources metrics
	// (podresources.Config.Registerer). A registry takes one host's.
	Registerer prometheus.Registerer
	// Failed, when set, is called with Err once serving the PodResources
	// API failed and Done is closed: an owner that ends with its host
	// learns of it without a goroutine waiting on Done.
	Failed func(error)
}

// Host is the kubelet side of a node. Create it with New, Start it, and
// Stop it when done.
type Host struct {
	// Manager is the device manager: its resources, devices and
	// allocations; admit pods through the host (AdmitPod).
	Manager *devicemanager.Manager
	// DRA is the DRA manager: its drivers and claims; prepare the claims
	// of pods through the host (PrepareDynamicResources). Its drivers register through the plugin watcher
	// (pluginwatcher.DRAPlugin) and its claims are the PodResources
	// API's dynamic_resources.
	DRA *dramanager.Manager
	// Pods is the host's pod store, what the PodResources API lists.
	Pods *podresources.PodStore
	// Watcher is the plugin watcher, set by Start.
	Watcher *pluginwatcher.Watcher
	// PodResources is the PodResources server, set by Start, which serves
	// it on PodResourcesSocket.
	PodResources *podresources.Server

	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	cancel  context.CancelFunc // ends what Start started; nil before
	done    chan struct{}      // closed once the watcher and the server ended
	err     error              // the PodResources server's, set before done closes
	stopped bool
}

// New validates cfg and creates the device manager and the pod store,
// which callers may need before Start (a pods provider that admits
// through the manager, say).
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
		AdmissionWait:  cfg.AdmissionWait,
	})
	if err != nil {
		return nil, err
	}
	pods := podresources.NewPodStore()
	dra, err := dramanager.New(dramanager.Config{
		Root:        cfg.Root,
		Claims:      cfg.Claims,
		ActivePods:  pods.GetActivePods,
		Slices:      cfg.Slices,
		WipingDelay: cfg.WipingDelay,
		Registerer:  cfg.Registerer,
		Logger:      log.With("component", "dramanager"),
	})
	if err != nil {
		return nil, err
	}
	return &Host{Manager: mgr, DRA: dra, Pods: pods, cfg: cfg, log: log}, nil
}

// Start starts the device manager, drops restored allocations of pods not
// in active (as the kubelet does for pods it no longer runs), starts the
// plugin watcher and serves the PodResources API on PodResourcesSocket,
// answering its questions about pods from h.Pods. Everything runs until
// ctx ends, Stop is called or serving the PodResources API fails; Done
// tells when it has ended. Start may be called once; on error, everything
// it started is stopped.
func (h *Host) Start(ctx context.Context, active []types.UID) error {
	pods := h.Pods
	h.mu.Lock()
	if h.cancel != nil || h.stopped {
		h.mu.Unlock()
		return errors.New("devicehost: already started or stopped")
	}
	ctx, cancel := context.WithCancel(ctx)
	h.cancel, h.done = cancel, make(chan struct{})
	h.mu.Unlock()

	fail := func(err error) error {
		cancel()
		h.DRA.Stop()
		h.Manager.Stop()
		close(h.done)
		return err
	}
	if err := h.Manager.Start(ctx); err != nil {
		return fail(err)
	}
	h.Manager.RetainPods(active)
	// With an unreadable checkpoint, the devices of the pods still running
	// are unknown: hold their resources back until they are gone.
	h.Manager.HoldUnknown(podsIn(pods.GetActivePods(), active))
	if err := h.DRA.Start(ctx); err != nil {
		return fail(err)
	}
	prs, err := podresources.NewServer(podresources.Config{
		Providers:  podresources.Providers{Pods: pods, Devices: h.Manager, DynamicResources: h.DRA},
		Logger:     h.log.With("component", "podresources"),
		Registerer: h.cfg.Registerer,
	})
	if err != nil {
		return fail(err)
	}
	l, err := unixsock.Listen(h.PodResourcesSocket())
	if err != nil {
		return fail(err)
	}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:    filepath.Join(h.cfg.Root, "plugins_registry"),
		Logger: h.log.With("component", "pluginwatcher"),
		Handlers: map[string]pluginwatcher.Handler{
			pluginwatcher.DevicePlugin: h.Manager.PluginHandler(),
			pluginwatcher.DRAPlugin:    h.DRA.PluginHandler(),
		},
	})
	if err == nil {
		err = w.Start(ctx)
	}
	if err != nil {
		_ = l.Close()
		return fail(err)
	}
	h.Watcher, h.PodResources = w, prs
	go h.serve(ctx, cancel, l)
	return nil
}

// serve serves the PodResources API on l until ctx ends, ending the rest
// of the host when serving fails, then waits for the watcher.
func (h *Host) serve(ctx context.Context, cancel context.CancelFunc, l net.Listener) {
	err := h.PodResources.ServeListener(ctx, l)
	cancel()
	<-h.Watcher.Done()
	h.err = err
	close(h.done)
	if err != nil && h.cfg.Failed != nil {
		h.cfg.Failed(err)
	}
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

// UIDs returns the UIDs of pods, for Start's active pods.
func UIDs(pods []*corev1.Pod) []types.UID {
	out := make([]types.UID, 0, len(pods))
	for _, p := range pods {
		out = append(out, p.UID)
	}
	return out
}

// PodResourcesSocket is where the PodResources API is served.
func (h *Host) PodResourcesSocket() string { return podresources.SocketPath(h.cfg.Root) }

// Done is closed once what Start started has ended (its context ended,
// Stop was called, or serving the PodResources API failed); the device
// manager is stopped by Stop alone. Done is nil before Start.
func (h *Host) Done() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.done
}

// Err returns why serving the PodResources API failed, once Done is
// closed; nil when it stopped because the host was stopped.
func (h *Host) Err() error {
	h.mu.Lock()
	done := h.done
	h.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return h.err
	default:
		return nil
	}
}

// Stop stops everything the host runs and waits for it, in the reverse
// of Start's order: the PodResources server (its socket removed), the
// plugin watcher, the DRA manager and the device manager.
// It may be called whatever happened before (no Start, a failed Start, a
// context already ended), from any goroutine, any number of times.
func (h *Host) Stop() {
	h.mu.Lock()
	h.stopped = true
	cancel, done := h.cancel, h.done
	h.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	h.DRA.Stop()
	h.Manager.Stop()
}
