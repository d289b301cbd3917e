// Package virtualnode runs a Kubernetes node without a kubelet on
// virtual-kubelet: the node registers itself, heartbeats with a Lease,
// runs a devicehost.Host (device plugins register with its device manager
// under Config.Root exactly as with a kubelet, DRA drivers with its DRA
// manager in Config.Root/plugins_registry), admits pods through the host
// (their device requests, then their ResourceClaims, read from the API
// server), serves the PodResources API and the kubelet API (logs, exec,
// /pods, /stats/summary) with webhook authentication and authorization,
// and hands pods to a backend (package backend: process or sim).
//
// See docs/virtual-node.md.
package virtualnode

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	corev1informers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/internal/ondemand"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/nodeapi"
)

// DefaultTaintKey is the key of the NoSchedule taint a virtual node
// registers with unless told otherwise; pods tolerate it with
// {key: dpkit.io/virtual-node, operator: Exists, effect: NoSchedule}.
const DefaultTaintKey = "dpkit.io/virtual-node"

// StatusCoalesce is how long a change of the node's status waits for
// others to be written with it.
const StatusCoalesce = 100 * time.Millisecond

// Defaults of Config fields left zero.
const (
	DefaultPort          = 10250
	DefaultLeaseDuration = 40
	DefaultPodSyncWorker = 10
	// DefaultStatusReportInterval is how often a node writes its status
	// when nothing changed: the kubelet's nodeStatusReportFrequency (5m;
	// with a Lease renewed every 10 s, the node's heartbeat is the
	// Lease). virtual-kubelet's own default is 1m.
	DefaultStatusReportInterval = 5 * time.Minute
	// KubeletVersion is reported in the node's nodeInfo.
	KubeletVersion = "v1.37.0-dpkit"
)

// DefaultTaint returns the taint a node registers with by default.
func DefaultTaint() corev1.Taint {
	return corev1.Taint{Key: DefaultTaintKey, Effect: corev1.TaintEffectNoSchedule}
}

// NewBackend builds a node's backend from what the node gives every
// backend.
type NewBackend func(name, root string, cfg backend.Config) (backend.Backend, error)

// Config configures one virtual node.
type Config struct {
	// Name of the Node object. Required.
	Name string
	// Root holds device-plugins/, plugins_registry/, pod-resources/ and
	// the backend's pod state. Required; absolute.
	Root string
	// Client talks to the API server. Required.
	Client kubernetes.Interface
	// HeartbeatClient renews the Lease and updates the node status;
	// TokenReviewClient and SubjectAccessReviewClient make the node API's
	// reviews. Nil means Client; NewClients says why they should not be.
	HeartbeatClient, TokenReviewClient, SubjectAccessReviewClient kubernetes.Interface
	// Informers is a shared informer factory over every pod (and the
	// ConfigMaps, Secrets and Services that pods' environments refer
	// to); nodes of one process share it. Nil makes a factory for this
	// node only, watching the pods bound to it.
	Informers informers.SharedInformerFactory
	// PodRouter, with Informers, hands each node of the process the
	// events of its own pods only (NewPodRouter over Informers' pod
	// informer); without it every node is told of every pod.
	PodRouter *PodRouter
	// SharedPods, with Informers, runs one virtual-kubelet pod controller
	// for the nodes of the process (NewSharedPods, named with this node):
	// the node joins it instead of running its own, and PodSyncWorkers
	// is unused.
	SharedPods *SharedPods
	// NewBackend builds the backend. Required.
	NewBackend NewBackend
	// BeforeRegistration, when set, is called once the node's kubelet
	// side runs (its device manager takes registrations and the plugin
	// watcher watches) and before the node registers its Node, which is
	// then created with the devices the device manager has. An error
	// ends the node. A kubelet whose device plugins registered before it
	// registered its Node creates the Node with their devices too:
	// dpkit node starts its in-process device plugins here, so that the
	// Node needs no status write for them (the node's Ready, with its
	// devices, at its first request).
	BeforeRegistration func(context.Context, *Node) error
	// Resources are the declared capacity (cpu, memory, pods and any
	// extended resource not served by device plugins). Device-plugin
	// resources are added as plugins register.
	Resources corev1.ResourceList
	// Taints the node registers with. Nil means DefaultTaint(); an empty
	// non-nil slice registers none.
	Taints []corev1.Taint
	// HostProcesses says the backend runs containers as host processes
	// (the process backend): a pod must then tolerate the node's own
	// NoSchedule taints (Taints) to be admitted, not only its NoExecute
	// ones as with a kubelet, since a pod that names the node in
	// spec.nodeName never meets the scheduler.
	HostProcesses bool
	// Labels are added to the node's default labels.
	Labels map[string]string
	// NodeIP is the node's InternalIP, where the API server reaches the
	// node API; the node API listens on it. Empty means DefaultNodeIP().
	NodeIP string
	// Hostname is reported as the node's Hostname address. Empty means
	// DefaultHostname(): the machine's name, as a kubelet reports it, so
	// that the address resolves (the node name need not).
	Hostname string
	// Port of the node API (the kubelet port). 0 means DefaultPort; -1
	// disables the node API.
	Port int
	// NoMetrics keeps none of the node's kubelet metrics (DRA,
	// PodResources): Metrics gathers nothing and the node API serves an
	// empty /metrics. dpkit node sets it for nodes without a node API,
	// whose metrics nothing could read; each node's would hold about
	// 6 KiB.
	NoMetrics bool
	// ClientCAFile, TLSCertFile and TLSKeyFile secure the node API; a
	// self-signed certificate is made when the key pair is absent.
	ClientCAFile, TLSCertFile, TLSKeyFile string
	// TopologyPolicy, TopologyScope and NUMANodes configure the device
	// manager.
	TopologyPolicy, TopologyScope string
	NUMANodes                     []int
	// DeviceGracePeriod is how long a device-plugin resource whose
	// plugins are all gone keeps its capacity (with zero allocatable)
	// before it drops to zero. Default 5m, the kubelet's.
	DeviceGracePeriod time.Duration
	// DeviceAdmissionWait holds a pod's admission while a device-plugin
	// resource it requests is known (from the checkpoint after a
	// restart, or a plugin gone within DeviceGracePeriod) but its plugin
	// does not serve it yet, up to this long, instead of failing the pod
	// with UnexpectedAdmissionError as the kubelet does. Zero (the
	// default) is the kubelet's behaviour.
	DeviceAdmissionWait time.Duration
	// DRAWipingDelay is how long a DRA driver may stay unusable (no
	// plugin registered and connected) before the node deletes its
	// ResourceSlices. Default 30s, the kubelet's. Every driver's slices
	// for the node are deleted when the node starts.
	DRAWipingDelay time.Duration
	// EventRecorder records pod events; nil records them to the API
	// through a broadcaster of the node's own. Nodes of one process can
	// share one: EventRecorder(b, name) for each, b from
	// NewEventBroadcaster.
	EventRecorder record.EventRecorder
	// DeviceClasses reads the DeviceClasses a device-plugin resource is
	// checked against when it registers; nodes of one process can share
	// one (NewDeviceClasses). Nil reads them for this node alone.
	DeviceClasses *DeviceClasses
	// PodSyncWorkers is the number of pod controller workers. Default 10.
	PodSyncWorkers int
	// StatusUpdateInterval is how often the node status is written
	// when nothing changed (a change, devices included, is written at
	// once). Default DefaultStatusReportInterval, the kubelet's
	// nodeStatusReportFrequency.
	StatusUpdateInterval time.Duration
	Logger               *slog.Logger
}

// Validate reports every problem of c with its field path.
func (c *Config) Validate() error {
	var errs field.ErrorList
	if c.Name == "" {
		errs = append(errs, field.Required(field.NewPath("name"), "name the node (--name)"))
	}
	if c.Root == "" || !filepath.IsAbs(c.Root) {
		errs = append(errs, field.Invalid(field.NewPath("root"), c.Root, "must be an absolute directory (--root)"))
	}
	if c.Client == nil {
		errs = append(errs, field.Required(field.NewPath("client"), "give an API client (--kubeconfig)"))
	}
	if c.NewBackend == nil {
		errs = append(errs, field.Required(field.NewPath("newBackend"), "choose a backend (--backend process|sim)"))
	}
	if c.Port < -1 || c.Port > 65535 {
		errs = append(errs, field.Invalid(field.NewPath("port"), c.Port, "must be 0..65535, or -1 to disable the node API"))
	}
	if c.DRAWipingDelay < 0 {
		errs = append(errs, field.Invalid(field.NewPath("draWipingDelay"), c.DRAWipingDelay.String(), "must not be negative; leave it zero for the kubelet's 30s"))
	}
	if c.NodeIP != "" && net.ParseIP(c.NodeIP) == nil {
		errs = append(errs, field.Invalid(field.NewPath("nodeIP"), c.NodeIP, "must be an IP address"))
	}
	return errs.ToAggregate()
}

// Node is a running virtual node.
type Node struct {
	cfg     Config
	log     *slog.Logger
	mgr     *devicehost.DeviceManager
	dra     *devicehost.DRAManager
	watcher *pluginwatcher.Watcher
	prov    *provider
	be      backend.Backend
	// apiLn is the node API's listener (nil when it is off), taken before
	// the node starts.
	apiLn    net.Listener
	apiAddr  net.Addr
	apiReady chan struct{}
	auth     *nodeapi.Auth
	// metrics holds the node's kubelet metrics (DRA, PodResources),
	// served on the node API's /metrics.
	metrics *prometheus.Registry

	mu       sync.Mutex
	node     *corev1.Node
	notifyCB func(*corev1.Node)
	// statusKick asks sendStatus to hand virtual-kubelet the node's
	// current status; sendStatus runs only while a send is pending.
	statusKick chan struct{}
	status     ondemand.Loop
	// pluginResources are the device-plugin resources the node has
	// reported. One the device manager removed stays on the Node with
	// zero capacity and allocatable, as the kubelet keeps it (see
	// resources).
	pluginResources map[corev1.ResourceName]bool
	// sentCapacity and sentAllocatable are what virtual-kubelet was
	// last handed (sendChanged); stale says the Node in the API server
	// was not written by this run (an earlier run's, taken as it is),
	// so the status is sent even if these did not change.
	sentCapacity, sentAllocatable corev1.ResourceList
	stale                         bool
	// classChecked are the device-plugin resources checked against the
	// DeviceClasses (warnServedBothWays); classesOnce says once that
	// they cannot be read.
	classChecked map[string]bool
	classesOnce  sync.Once
	// nodes registers the Node and writes its status, and answers reads
	// of it from the copy it last read or wrote (nodeCache).
	nodes *nodeCache
}

// DeviceManager returns the node's device manager.
func (n *Node) DeviceManager() *devicehost.DeviceManager { return n.mgr }

// Metrics returns the node's kubelet metrics (DRA, PodResources), which
// the node API serves on /metrics; none with Config.NoMetrics.
func (n *Node) Metrics() prometheus.Gatherer { return n.metrics }

// noMetrics is the empty registry of every node with Config.NoMetrics.
var noMetrics = prometheus.NewRegistry()

// DRAManager returns the node's DRA manager.
func (n *Node) DRAManager() *devicehost.DRAManager { return n.dra }

// Backend returns the node's backend.
func (n *Node) Backend() backend.Backend { return n.be }

// APIAddr returns the address the node API listens on, nil when disabled.
func (n *Node) APIAddr() net.Addr {
	select {
	case <-n.apiReady:
		return n.apiAddr
	default:
		return nil
	}
}

// APIAuthCacheSizes returns what the node API's webhook caches hold:
// accepted and refused tokens and authorization decisions (zeros when the
// node API is disabled).
func (n *Node) APIAuthCacheSizes() (accepted, refused, decisions int) {
	if n.auth == nil {
		return 0, 0, 0
	}
	return n.auth.CacheSizes()
}

// DefaultNodeIP is the node IP a kubelet without --node-ip would choose:
// the address of the interface with the default route (IPv4 first), or
// 127.0.0.1 on a machine without one. The API server's node proxy
// (nodes/NAME/proxy/..., used by kubectl top and get --raw) refuses
// loopback addresses; logs and exec work with any.
func DefaultNodeIP() string {
	if ip, err := utilnet.ChooseHostInterface(); err == nil && ip != nil {
		return ip.String()
	}
	return "127.0.0.1"
}

// DefaultHostname is the machine's name, lower-cased and trimmed as the
// kubelet's nodeutil.GetHostname does; "localhost" when it cannot be read.
func DefaultHostname() string {
	h, err := os.Hostname()
	if h = strings.ToLower(strings.TrimSpace(h)); err != nil || h == "" {
		return "localhost"
	}
	return h
}

// Run runs the node until ctx is done. started, when not nil, is called
// once the node is registered and its pod controller is running (with
// Config.SharedPods, once the node has joined it).
func Run(ctx context.Context, cfg Config, started func(*Node)) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("virtual node: %w", err)
	}
	if cfg.NodeIP == "" {
		cfg.NodeIP = DefaultNodeIP()
	}
	if cfg.Port == 0 {
		cfg.Port = DefaultPort
	}
	if cfg.Hostname == "" {
		cfg.Hostname = DefaultHostname()
	}
	if cfg.Taints == nil {
		cfg.Taints = []corev1.Taint{DefaultTaint()}
	}
	if cfg.PodSyncWorkers <= 0 {
		cfg.PodSyncWorkers = DefaultPodSyncWorker
	}
	for _, c := range []*kubernetes.Interface{&cfg.HeartbeatClient, &cfg.TokenReviewClient, &cfg.SubjectAccessReviewClient} {
		if *c == nil {
			*c = cfg.Client
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("node", cfg.Name)

	// The node API's port is taken before anything starts, so that a port
	// another process serves fails the node before it registers.
	var apiLn net.Listener
	if cfg.Port > 0 {
		l, err := listenNodeAPI(net.JoinHostPort(cfg.NodeIP, strconv.Itoa(cfg.Port)))
		if err != nil {
			return err
		}
		defer func() { _ = l.Close() }()
		apiLn = l
	}

	hostFailed := func() {} // the node's cancel once it has one
	reg, registerer := noMetrics, prometheus.Registerer(nil)
	if !cfg.NoMetrics {
		r := prometheus.NewRegistry()
		reg, registerer = r, r
	}
	host, err := devicehost.New(devicehost.Config{
		Root:           cfg.Root,
		Logger:         log,
		TopologyPolicy: cfg.TopologyPolicy,
		TopologyScope:  cfg.TopologyScope,
		NUMANodes:      cfg.NUMANodes,
		GracePeriod:    cfg.DeviceGracePeriod,
		AdmissionWait:  cfg.DeviceAdmissionWait,
		Claims:         apiClaims{cfg.Client},
		Slices:         apiSlices{client: cfg.Client, node: cfg.Name},
		WipingDelay:    cfg.DRAWipingDelay,
		Registerer:     registerer,
		// Serving PodResources failed: the node ends (run returns the
		// host's error).
		Failed: func(error) { hostFailed() },
	})
	if err != nil {
		return err
	}
	mgr := host.Manager
	n := &Node{cfg: cfg, log: log, mgr: mgr, dra: host.DRA, metrics: reg, apiLn: apiLn, apiReady: make(chan struct{}), statusKick: make(chan struct{}, 1), pluginResources: map[corev1.ResourceName]bool{},
		nodes: newNodeCache(cfg.HeartbeatClient.CoreV1().Nodes(), cfg.Name)}
	n.nodes.log = log.With("component", "registration")
	// The Node is created first; one an earlier run left is taken as it
	// is, and this run's status written over it.
	n.nodes.existing = n.takeNode
	n.prov = newProvider(log.With("component", "pods"), host)
	n.prov.events.log = log.With("component", "events")
	n.prov.nodeIP = cfg.NodeIP
	n.prov.ownTaints, n.prov.hostProcesses = cfg.Taints, cfg.HostProcesses
	n.be, err = cfg.NewBackend(cfg.Name, cfg.Root, backend.Config{
		Notify:       n.prov.backendNotify,
		ContainerEnv: n.prov.containerEnv,
		PreStart:     n.prov.preStart,
		Event:        n.prov.events.record,

		ContainerDevices: n.prov.containerDevices,
		Volumes:          apiVolumes{cfg.Client},
		NodeAllocatable:  func() corev1.ResourceList { _, a := n.resources(); return a },
		NodeIP:           cfg.NodeIP,
		Logger:           log.With("component", "backend"),
	})
	if err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	defer n.be.Close()
	n.prov.be = n.be
	n.prov.adopt(n.be.Pods())

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hostFailed = cancel
	if err := host.Start(ctx, devicehost.UIDs(host.Pods.GetActivePods())); err != nil {
		return err
	}
	defer host.Stop()
	defer cancel()
	n.watcher = host.Watcher

	factory := cfg.Informers
	if factory == nil {
		factory = NewInformerFactory(cfg.Client)
		podFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, stripManagedFields,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.Name).String()
			}))
		// The node's own Node, as the kubelet watches it (its labels
		// and taints, for admission).
		nodeFactory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, stripManagedFields,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.Name).String()
			}))
		defer podFactory.Shutdown()
		defer nodeFactory.Shutdown()
		defer factory.Shutdown()
		return n.run(ctx, cancel, host, podFactory, podFactory.Core().V1().Pods(), nodeFactory, factory, started)
	}
	var pods corev1informers.PodInformer = factory.Core().V1().Pods()
	if cfg.PodRouter != nil {
		pods = cfg.PodRouter.For(cfg.Name)
	}
	// Nodes of one process share one informer over every Node.
	return n.run(ctx, cancel, host, factory, pods, factory, factory, started)
}

func (n *Node) run(ctx context.Context, cancel context.CancelFunc, host *devicehost.Host, podFactory informers.SharedInformerFactory, podInformer corev1informers.PodInformer, nodeFactory, factory informers.SharedInformerFactory, started func(*Node)) error {
	cfg := n.cfg
	nodeLister := nodeFactory.Core().V1().Nodes().Lister()
	recorder := cfg.EventRecorder
	if recorder == nil {
		b := NewEventBroadcaster(ctx, cfg.Client)
		defer b.Shutdown()
		recorder = EventRecorder(b, cfg.Name)
	}
	n.prov.recorder = recorder
	n.prov.events.set(recorder)
	podLister := podInformer.Lister()
	n.prov.api.Store(&apiView{
		inAPI: func(namespace, name string, uid types.UID) bool {
			p, err := podLister.Pods(namespace).Get(name)
			return err == nil && p.UID == uid
		},
		apiPod: func(namespace, name string) *corev1.Pod {
			p, _ := podLister.Pods(namespace).Get(name)
			return p
		},
	})
	var pc *vknode.PodController // nil with SharedPods
	var podsReady <-chan struct{}
	if cfg.SharedPods != nil {
		podsReady = cfg.SharedPods.Ready()
	} else {
		var err error
		pc, err = vknode.NewPodController(vknode.PodControllerConfig{
			PodClient:         holdingPods{PodsGetter: cfg.Client.CoreV1(), held: func(_, _ string, uid types.UID) bool { return n.dra.PodMightNeedToUnprepareResources(uid) }},
			PodInformer:       podInformer,
			EventRecorder:     withoutVKSuccess{recorder},
			Provider:          n.prov,
			ConfigMapInformer: factory.Core().V1().ConfigMaps(),
			SecretInformer:    factory.Core().V1().Secrets(),
			ServiceInformer:   factory.Core().V1().Services(),
			PodEventFilterFunc: func(_ context.Context, p *corev1.Pod) bool {
				return p.Spec.NodeName == cfg.Name
			},
		})
		if err != nil {
			return err
		}
		podsReady = pc.Ready()
	}
	if _, err := podInformer.Informer().AddEventHandler(cache.FilteringResourceEventHandler{
		FilterFunc: func(obj any) bool {
			p, ok := obj.(*corev1.Pod)
			return ok && n.deletable(p)
		},
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { n.finishDeletion(ctx, obj.(*corev1.Pod)) },
			UpdateFunc: func(_, obj any) { n.finishDeletion(ctx, obj.(*corev1.Pod)) },
		},
	}); err != nil {
		return err
	}
	n.prov.unprepared = func(pod *corev1.Pod) {
		if api, err := podLister.Pods(pod.Namespace).Get(pod.Name); err == nil && api.UID == pod.UID && n.deletable(api) {
			n.finishDeletion(ctx, api)
		}
	}
	if err := n.beforeRegistration(ctx); err != nil || ctx.Err() != nil {
		return err // nil when stopped meanwhile
	}
	n.node = n.nodeObject()
	n.markSent(n.node)
	n.prov.node = func() *corev1.Node {
		if cur, err := nodeLister.Get(cfg.Name); err == nil {
			return cur
		}
		// Not yet listed: the node as it registers, with its own labels
		// and taints (a copy made only then, not held for the node's
		// life).
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.node.DeepCopy()
	}
	interval := cfg.StatusUpdateInterval
	if interval <= 0 {
		interval = DefaultStatusReportInterval
	}
	// The Lease is the node's own (runLease), not virtual-kubelet's
	// controller's: that one renews it again as soon as it has created
	// it, and reads it before it creates it. Without it, the node
	// controller writes the status at its ping interval.
	nc, err := vknode.NewNodeController(n, n.node.DeepCopy(), n.nodes,
		vknode.WithNodeStatusUpdateInterval(interval), vknode.WithNodePingInterval(interval))
	if err != nil {
		return err
	}

	// The provider is complete: the pod controller may call it from now.
	if cfg.SharedPods != nil {
		leave, err := cfg.SharedPods.join(cfg.Name, n.prov, recorder, n.dra.PodMightNeedToUnprepareResources)
		if err != nil {
			return err
		}
		defer leave()
	}
	g, gctx := errgroup.WithContext(ctx)
	if pc != nil {
		g.Go(func() error {
			if err := pc.Run(gctx, cfg.PodSyncWorkers); err != nil && gctx.Err() == nil {
				return fmt.Errorf("pod controller: %w", err)
			}
			return nil
		})
	}
	podFactory.Start(gctx.Done())
	nodeFactory.Start(gctx.Done())
	factory.Start(gctx.Done())
	n.status.Start(gctx, n.sendStatus, n.statusPending)
	defer n.status.Stop() // after g.Wait, which ends gctx
	stopHealth := n.prov.startHealth(gctx, func() { n.devicesChanged(gctx) })
	defer stopHealth() // after g.Wait, which ends gctx
	n.prov.draq.loop.Start(gctx, n.prov.runDRA, n.prov.draq.hasWork)
	defer n.prov.draq.loop.Stop() // after g.Wait, which ends gctx
	if cfg.Port > 0 {
		if err := n.startAPI(gctx, g); err != nil {
			cancel()
			_ = g.Wait()
			return err
		}
	}
	g.Go(func() error {
		n.runLease(gctx, nc.Ready())
		return nil
	})
	g.Go(func() error {
		select {
		case <-nc.Ready():
		case <-gctx.Done():
			return nil
		}
		n.removeStartupTaints(gctx)
		// A node's own pod controller runs by now; a shared one waits for
		// every node of the process, which this node's plugins need not
		// (they start once the node runs): it has joined.
		if cfg.SharedPods == nil {
			select {
			case <-podsReady:
			case <-gctx.Done():
				return nil
			}
		}
		n.log.Info("Virtual node running", "root", cfg.Root, "registration", n.mgr.SocketPath(),
			"podResources", podresources.SocketPath(cfg.Root), "api", n.APIAddr())
		if started != nil {
			started(n)
		}
		return nil
	})
	if oc, ok := n.be.(backend.OrphanCleaner); ok {
		g.Go(func() error {
			select {
			case <-podsReady:
			case <-gctx.Done():
				return nil
			}
			n.cleanupOrphans(gctx, oc, podLister)
			return nil
		})
	}
	// The node controller runs on this goroutine, one fewer for each
	// node of a process; its end, a failure of the host (Failed above) or
	// of anything in g ends the node.
	err = nc.Run(gctx)
	if err != nil && gctx.Err() == nil {
		err = fmt.Errorf("node controller: %w", err)
		cancel()
	} else {
		err = nil
	}
	werr := g.Wait()
	if herr := host.Err(); herr != nil {
		return herr
	}
	if err != nil {
		return err
	}
	return werr
}

// beforeRegistration runs Config.BeforeRegistration, when set, and
// returns its error unless ctx ended meanwhile.
func (n *Node) beforeRegistration(ctx context.Context) error {
	if n.cfg.BeforeRegistration == nil {
		return nil
	}
	if err := n.cfg.BeforeRegistration(ctx, n); err != nil && ctx.Err() == nil {
		return err
	}
	return nil
}

// NewInformerFactory returns the informer factory that nodes of one
// process share (Config.Informers). What it caches carries no
// managedFields: no part of a node reads them, and an update without
// them keeps the API server's, so a thousand nodes do not hold every
// Node's and pod's field owners (as kube-scheduler and
// kube-controller-manager drop them). Nor do its Nodes carry the status
// each node last applied (an annotation of a couple of KiB, which a node
// reads from its own Node as the API server has it, not from here).
func NewInformerFactory(client kubernetes.Interface) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(client, 0, stripManagedFields)
}

var stripManagedFields = informers.WithTransform(func(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	if node, ok := obj.(*corev1.Node); ok {
		delete(node.Annotations, lastAppliedStatus)
	}
	return obj, nil
})

// NewEventBroadcaster returns a broadcaster that writes events to the API
// through client until ctx ends or it is shut down. Nodes of one process
// share one (as one kubelet has one): one queue and one writer for all of
// them, rather than three goroutines and a 1 000-event queue each.
func NewEventBroadcaster(ctx context.Context, client kubernetes.Interface) record.EventBroadcaster {
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	return b
}

// EventRecorder records the events of the node named node through b, with
// the source the node's events carry (component dpkit-node, the node as
// host).
func EventRecorder(b record.EventBroadcaster, node string) record.EventRecorder {
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "dpkit-node", Host: node})
}
