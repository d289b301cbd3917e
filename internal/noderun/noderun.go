// Package noderun runs what "dpkit node" runs: one or more virtual nodes
// (pkg/virtualnode) sharing API clients and informers, with the pod
// backend the options name.
package noderun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/informers"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/drafront"
	"github.com/dpkit/dpkit/internal/kubeconfig"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/internal/rootlock"
	"github.com/dpkit/dpkit/pkg/configfile"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/cri"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/process"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// Options are the flags of "dpkit node".
type Options struct {
	// PluginClock times the in-process plugins of PluginConfig (tests);
	// nil is the real clock.
	PluginClock clock.WithTicker
	// Kubeconfig is --kubeconfig; empty means $KUBECONFIG, ~/.kube/config,
	// then the in-cluster configuration (internal/kubeconfig).
	Kubeconfig   string
	Name         string
	Root         string
	Backend      string
	ClientCAFile string
	TLSCertFile  string
	TLSKeyFile   string
	Port         int
	NodeIP       string
	Taints       []string
	CPU, Memory  string
	Pods         string
	Resources    []string
	Count        int
	QPS          float64
	Burst        int
	SimStart     time.Duration
	SimRun       time.Duration
	BackoffStart time.Duration
	// CRIEndpoint is the container runtime's CRI socket of the cri
	// backend (unix:///run/containerd/containerd.sock).
	CRIEndpoint string
	// ClusterDNS, ClusterDomain and ResolvConf are the cri backend's DNS
	// settings, as the kubelet's --cluster-dns, --cluster-domain and
	// --resolv-conf.
	ClusterDNS    []string
	ClusterDomain string
	ResolvConf    string
	// CgroupRoot is the cri backend's cgroupfs path below which each pod
	// gets pod<UID> (the kubelet's --cgroup-root); empty leaves pods in
	// the runtime's default cgroups.
	CgroupRoot string
	// SyncFrequency is how often the cri backend writes the pods'
	// ConfigMap, Secret, downward API and token volumes again, as the
	// kubelet's --sync-frequency; 0 is the kubelet's default, 1m.
	SyncFrequency time.Duration
	// LogMaxSize and LogMaxFiles rotate the process backend's container
	// logs, like the kubelet's containerLogMaxSize and containerLogMaxFiles.
	LogMaxSize  resource.Quantity
	LogMaxFiles int
	// CDISpecDirs are where the process backend reads the CDI specs of
	// containers' CDI devices, for the environment they give.
	CDISpecDirs []string
	// DeviceGracePeriod is how long a resource whose device plugins are
	// all gone keeps its capacity; 0 means the kubelet's 5m.
	DeviceGracePeriod time.Duration
	// DeviceAdmissionWait is --device-admission-wait
	// (virtualnode.Config.DeviceAdmissionWait); 0 refuses at once, as the
	// kubelet.
	DeviceAdmissionWait time.Duration
	// PluginConfig is --plugin-config: a dpkit plugin config served in
	// this process for every node, each instance on its node's
	// directories (and, for the dra front, publishing for its node), so N
	// nodes need no N plugin processes.
	PluginConfig string
	// PodSyncWorkers is --pod-sync-workers: the workers of each of the
	// three pod queues (sync, delete, status) of a node, or of the nodes
	// of a Count above 1, which share them; 0 means
	// DefaultPodSyncWorkers(Count, Backend).
	PodSyncWorkers int
	// PluginRegistration is --plugin-registration: how the in-process
	// plugins reach their nodes' device managers, RegistrationSocket or
	// RegistrationInProcess; "" means DefaultPluginRegistration(Count).
	PluginRegistration string
	// InotifyLimit is --inotify-limit: InotifyCheck (""), InotifyRaise or
	// InotifyRaiseOnly.
	InotifyLimit string
	// DRAWipingDelay is how long a DRA driver may stay unusable before
	// the node deletes its ResourceSlices; 0 means the kubelet's 30s. It
	// has no flag (the kubelet has none): tests and programs that embed
	// the node set it.
	DRAWipingDelay time.Duration
}

// Validate reports every problem of the options at once, each named by
// its flag, as configfile.Problems (the bulleted field-path list).
func (o *Options) Validate() error {
	var errs field.ErrorList
	if o.Name == "" {
		errs = append(errs, field.Required(field.NewPath("--name"), "name the node"))
	}
	if o.Root == "" {
		errs = append(errs, field.Required(field.NewPath("--root"), "give the node's root directory"))
	}
	switch o.Backend {
	case "process", "sim":
		if o.CRIEndpoint != "" {
			errs = append(errs, field.Invalid(field.NewPath("--cri-endpoint"), o.CRIEndpoint, "only the cri backend uses a container runtime: add --backend cri, or leave --cri-endpoint out"))
		}
		if o.CgroupRoot != "" {
			errs = append(errs, field.Invalid(field.NewPath("--cgroup-root"), o.CgroupRoot, "only the cri backend puts pods in cgroups: add --backend cri, or leave --cgroup-root out"))
		}
	case "cri":
		if o.CRIEndpoint == "" {
			errs = append(errs, field.Required(field.NewPath("--cri-endpoint"), "the cri backend needs the container runtime's socket, e.g. unix:///run/containerd/containerd.sock"))
		} else if strings.Contains(o.CRIEndpoint, "://") && !strings.HasPrefix(o.CRIEndpoint, "unix://") {
			errs = append(errs, field.Invalid(field.NewPath("--cri-endpoint"), o.CRIEndpoint, "only unix sockets are supported: unix:///path/to/runtime.sock"))
		}
		if r := o.CgroupRoot; r != "" && (!filepath.IsAbs(r) || filepath.Clean(r) != r || r == "/") {
			errs = append(errs, field.Invalid(field.NewPath("--cgroup-root"), r, "want a clean absolute cgroupfs path below the root, e.g. /dpkit"))
		}
	default:
		errs = append(errs, field.NotSupported(field.NewPath("--backend"), o.Backend, []string{"process", "sim", "cri"}))
	}
	for i, ip := range o.ClusterDNS {
		if net.ParseIP(ip) == nil {
			errs = append(errs, field.Invalid(field.NewPath("--cluster-dns").Index(i), ip, "want an IP address"))
		}
	}
	if o.DeviceAdmissionWait < 0 {
		errs = append(errs, field.Invalid(field.NewPath("--device-admission-wait"), o.DeviceAdmissionWait.String(), "must not be negative; 0 refuses a pod whose plugin is not back at once, as the kubelet"))
	}
	switch o.InotifyLimit {
	case "", InotifyCheck, InotifyRaise, InotifyRaiseOnly:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("--inotify-limit"), o.InotifyLimit, []string{InotifyCheck, InotifyRaise, InotifyRaiseOnly}))
	}
	if o.DeviceGracePeriod < 0 {
		errs = append(errs, field.Invalid(field.NewPath("--device-grace-period"), o.DeviceGracePeriod.String(), "must not be negative"))
	}
	if o.DRAWipingDelay < 0 {
		errs = append(errs, field.Invalid(field.NewPath("draWipingDelay"), o.DRAWipingDelay.String(), "must not be negative; leave it zero for the kubelet's 30s"))
	}
	if o.SyncFrequency < 0 {
		errs = append(errs, field.Invalid(field.NewPath("--sync-frequency"), o.SyncFrequency.String(), "must not be negative; leave it zero for the kubelet's 1m"))
	}
	if o.Count < 1 {
		errs = append(errs, field.Invalid(field.NewPath("--count"), o.Count, "must be at least 1"))
	}
	switch o.PluginRegistration {
	case "", RegistrationSocket, RegistrationInProcess:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("--plugin-registration"), o.PluginRegistration, []string{RegistrationSocket, RegistrationInProcess}))
	}
	if o.PodSyncWorkers < 0 {
		errs = append(errs, field.Invalid(field.NewPath("--pod-sync-workers"), o.PodSyncWorkers, "must not be negative; leave it 0 for the default"))
	}
	if o.QPS <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("--qps"), o.QPS, "must be positive"))
	}
	if o.Burst < 1 {
		errs = append(errs, field.Invalid(field.NewPath("--burst"), o.Burst, "must be at least 1"))
	}
	_, resErrs := o.resources()
	errs = append(errs, resErrs...)
	var pluginErr error
	if o.PluginConfig != "" {
		_, _, pluginErr = o.pluginConfig()
	}
	for i, t := range o.Taints {
		if _, err := ParseTaints([]string{t}); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("--taint").Index(i), t, strings.TrimPrefix(err.Error(), strconv.Quote(t)+": ")))
		}
	}
	return errors.Join(configfile.Join(errs), pluginErr)
}

// resources returns the declared capacity: --cpu, --memory, --pods and
// every --resource, with a problem named by its flag for each that does
// not parse.
func (o *Options) resources() (corev1.ResourceList, field.ErrorList) {
	rl := corev1.ResourceList{}
	var errs field.ErrorList
	add := func(p *field.Path, name, q string) {
		v, err := resource.ParseQuantity(q)
		if err != nil {
			errs = append(errs, field.Invalid(p, q, "not a quantity such as 8, 500m or 32Gi"))
			return
		}
		rl[corev1.ResourceName(name)] = v
	}
	add(field.NewPath("--cpu"), "cpu", o.CPU)
	add(field.NewPath("--memory"), "memory", o.Memory)
	add(field.NewPath("--pods"), "pods", o.Pods)
	for i, r := range o.Resources {
		p := field.NewPath("--resource").Index(i)
		name, q, ok := strings.Cut(r, "=")
		if !ok || name == "" {
			errs = append(errs, field.Invalid(p, r, "must be NAME=QUANTITY, e.g. example.com/foo=4"))
			continue
		}
		add(p, name, q)
	}
	return rl, errs
}

// pluginConfig reads --plugin-config and returns a function that decodes
// a fresh copy of it for one node (its root and name), served on that
// node's directories: the device plugin and registration directories,
// and for the dra front the node's plugins directory and PodResources
// socket, publishing for the node, its CDI specs in <root>/cdi unless
// dra.cdiDir names another (the CRI backend's runtime reads its own).
// nodeCDI reports whether they write in <root>/cdi.
func (o *Options) pluginConfig() (perNode func(root, node string) (*config.PluginConfig, error), nodeCDI bool, err error) {
	cfg, err := config.LoadPluginConfig(o.PluginConfig, "--plugin-config")
	if err != nil {
		return nil, false, err
	}
	var errs field.ErrorList
	if cfg.MetricsAddress != "" {
		errs = append(errs, field.Invalid(field.NewPath("metricsAddress"), cfg.MetricsAddress, "the in-process plugins of dpkit node serve no metrics of their own: remove it"))
	}
	dra := field.NewPath("dra")
	for _, d := range []struct {
		path       *field.Path
		value, def string
	}{
		{field.NewPath("pluginDir"), cfg.PluginDir, ""},
		{field.NewPath("registryDir"), cfg.RegistryDir, ""},
		{dra.Child("pluginsDir"), cfg.DRA.PluginsDir, config.DefaultDRAPluginsDir},
		{dra.Child("podResourcesSocket"), cfg.DRA.PodResourcesSocket, config.DefaultPodResourcesSocket},
		{dra.Child("nodeName"), cfg.DRA.NodeName, ""},
		{dra.Child("kubeconfig"), cfg.DRA.Kubeconfig, ""},
	} {
		if d.value != d.def {
			errs = append(errs, field.Invalid(d.path, d.value, "dpkit node serves each in-process plugin for its own node, in the node's root and with the node's API client: remove it"))
		}
	}
	if err := configfile.Join(errs); err != nil {
		return nil, false, fmt.Errorf("--plugin-config %s:\n%w", o.PluginConfig, err)
	}
	// Decoded once: decoding the file again for each node took about a
	// seventh of the CPU 1 000 nodes took to start (docs/performance.md).
	copies, err := cfg.Copies()
	if err != nil {
		return nil, false, err
	}
	nodeCDI = cfg.UsesFront(config.FrontDRA) && cfg.DRA.CDIDir == config.DefaultCDIDir
	return func(root, node string) (*config.PluginConfig, error) {
		c, err := copies()
		if err != nil {
			return nil, err
		}
		c.PluginDir = devicemanager.PluginDir(root)
		c.RegistryDir = filepath.Join(root, "plugins_registry")
		c.DRA.PluginsDir = filepath.Join(root, "plugins")
		c.DRA.PodResourcesSocket = filepath.Join(root, "pod-resources", "kubelet.sock")
		if c.DRA.CDIDir == config.DefaultCDIDir {
			c.DRA.CDIDir = nodeCDIDir(root)
		}
		c.DRA.NodeName = node
		return c, nil
	}, nodeCDI, nil
}

// DefaultPodSyncWorkers is the workers of each pod queue when
// --pod-sync-workers is 0. One node has virtual-kubelet's 10. The nodes
// of a --count above 1 share one pod controller (virtualnode.SharedPods):
// 2 workers a node, as many pods syncing at once as when each node had
// its own controller with 2, up to 64 (sim backend: 1 a node, up to 32,
// its pods starting and stopping without waiting on anything), past which
// more workers only wait on the API server (docs/performance.md).
func DefaultPodSyncWorkers(count int, backend string) int {
	switch {
	case count <= 1:
		return virtualnode.DefaultPodSyncWorker
	case backend == "sim":
		return min(count, 32)
	}
	return min(2*count, 64)
}

// The --plugin-registration values.
const (
	// RegistrationSocket: an in-process plugin serves its socket in its
	// node's plugins_registry and registers through the node's plugin
	// watcher, as a plugin DaemonSet does on a kubelet.
	RegistrationSocket = "socket"
	// RegistrationInProcess: an in-process plugin hands its service to its
	// node's device manager without a socket
	// (deviceplugin.Config.InProcess); past the socket, the registration,
	// ListAndWatch, Allocate and the rest are the same calls.
	RegistrationInProcess = "in-process"
)

// DefaultPluginRegistration is how in-process plugins register when
// --plugin-registration is empty: through sockets for one node, which
// then looks to plugins and tools as a kubelet does; in process for each
// of many nodes, where a plugin's socket, gRPC server and connection cost
// a node a dozen goroutines (docs/performance.md).
func DefaultPluginRegistration(count int) string {
	if count > 1 {
		return RegistrationInProcess
	}
	return RegistrationSocket
}

// nodeCDIDir is where the DRA fronts of a node's in-process plugins write
// the CDI specs of its prepared claims; its process backend reads them.
func nodeCDIDir(root string) string { return filepath.Join(root, "cdi") }

// ParseTaints parses key[=value]:Effect taints; an empty string is
// skipped.
func ParseTaints(specs []string) ([]corev1.Taint, error) {
	out := []corev1.Taint{}
	var errs []error
	for _, s := range specs {
		if s == "" {
			continue
		}
		kv, effect, ok := strings.Cut(s, ":")
		if !ok {
			errs = append(errs, fmt.Errorf("%q: want key[=value]:Effect", s))
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		e := corev1.TaintEffect(effect)
		if e != corev1.TaintEffectNoSchedule && e != corev1.TaintEffectPreferNoSchedule && e != corev1.TaintEffectNoExecute {
			errs = append(errs, fmt.Errorf("%q: effect must be NoSchedule, PreferNoSchedule or NoExecute", s))
			continue
		}
		if k == "" {
			errs = append(errs, fmt.Errorf("%q: empty key", s))
			continue
		}
		out = append(out, corev1.Taint{Key: k, Value: v, Effect: e})
	}
	return out, errors.Join(errs...)
}

// roots returns the root directory of each node: root itself for one
// node, root/NAME-i for each of several.
func roots(root string, o Options) []string {
	if o.Count <= 1 {
		return []string{root}
	}
	out := make([]string, o.Count)
	for i := range out {
		out[i] = filepath.Join(root, o.Name+"-"+strconv.Itoa(i))
	}
	return out
}

// Run runs the nodes until ctx is done; log may be nil. started, when not nil, is called
// once every node runs.
func Run(ctx context.Context, log *slog.Logger, o Options, started func([]*virtualnode.Node)) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// First: raise-only is a privileged step before the nodes run, with
	// no API server client.
	if err := checkInotify(o, inotifyLimit, "/proc", log); err != nil {
		return cli.Exit(2, err)
	}
	if o.InotifyLimit == InotifyRaiseOnly {
		return nil
	}
	rc, err := kubeconfig.Load(o.Kubeconfig)
	if err != nil {
		return cli.Exit(2, err)
	}
	rc.UserAgent = "dpkit-node"
	clients, err := virtualnode.NewClients(rc, float32(o.QPS), o.Burst)
	if err != nil {
		return cli.Exit(2, err)
	}
	client := clients.Client
	res, _ := o.resources()
	taints, _ := ParseTaints(o.Taints)
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return err
	}
	var newBackend virtualnode.NewBackend
	var (
		pluginCfg func(root, node string) (*config.PluginConfig, error)
		nodeCDI   bool
	)
	if o.PluginConfig != "" {
		if pluginCfg, nodeCDI, err = o.pluginConfig(); err != nil {
			return cli.Exit(2, err)
		}
	}
	switch o.Backend {
	case "sim":
		newBackend = func(_, _ string, c backend.Config) (backend.Backend, error) {
			return sim.New(sim.Config{Config: c, StartDelay: o.SimStart, RunDuration: o.SimRun}), nil
		}
	case "cri":
		newBackend = func(name, root string, c backend.Config) (backend.Backend, error) {
			return cri.New(ctx, cri.Config{
				Config: c, Endpoint: o.CRIEndpoint, Node: name, LogDir: filepath.Join(root, "pods"), BackoffInitial: o.BackoffStart,
				ClusterDNS: o.ClusterDNS, ClusterDomain: o.ClusterDomain, ResolvConf: o.ResolvConf,
				VolumeResync: o.SyncFrequency, CgroupRoot: o.CgroupRoot,
			})
		}
	default:
		newBackend = func(_, root string, c backend.Config) (backend.Backend, error) {
			cdiDirs := o.CDISpecDirs
			if nodeCDI {
				// The in-process plugins' DRA fronts write there.
				cdiDirs = append(slices.Clone(cdiDirs), nodeCDIDir(root))
			}
			return process.New(process.Config{Config: c, Dir: filepath.Join(root, "pods"), BackoffInitial: o.BackoffStart,
				ContainerLogMaxSize: o.LogMaxSize.Value(), ContainerLogMaxFiles: o.LogMaxFiles, CDISpecDirs: cdiDirs})
		}
	}
	// The DRA fronts of every node's in-process plugins share the nodes'
	// API client.
	draFront := drafront.WithClient(client)
	var (
		shared     informers.SharedInformerFactory
		router     *virtualnode.PodRouter
		sharedPods *virtualnode.SharedPods
		classes    *virtualnode.DeviceClasses
	)
	if o.Count > 1 {
		classes = virtualnode.NewDeviceClasses(client)
		shared = virtualnode.NewInformerFactory(client)
		defer shared.Shutdown()
		if router, err = virtualnode.NewPodRouter(ctx, shared.Core().V1().Pods()); err != nil {
			return err
		}
		names := make([]string, o.Count)
		for i := range names {
			names[i] = o.Name + "-" + strconv.Itoa(i)
		}
		// One pod controller for all the nodes (virtualnode.SharedPods).
		if sharedPods, err = virtualnode.NewSharedPods(client, shared, names); err != nil {
			return err
		}
	}
	// One event broadcaster for all the nodes, as one kubelet has one.
	events := virtualnode.NewEventBroadcaster(ctx, client)
	defer events.Shutdown()
	workers := o.PodSyncWorkers
	if workers == 0 {
		workers = DefaultPodSyncWorkers(o.Count, o.Backend)
	}
	registration := o.PluginRegistration
	if registration == "" {
		registration = DefaultPluginRegistration(o.Count)
	}
	// One node per root: a second one would replace this one's sockets,
	// and remove them when it stops.
	nodeRoots := roots(root, o)
	for _, r := range nodeRoots {
		lock, err := rootlock.Acquire(r)
		if err != nil {
			return err
		}
		defer func() { _ = lock.Release() }()
	}
	var (
		mu    sync.Mutex
		nodes []*virtualnode.Node
	)
	g, gctx := errgroup.WithContext(ctx)
	// The nodes stop once the in-process plugins have, as dpkit up stops
	// its plugins first: a plugin whose node's registration socket went
	// first would log a failed registration on every clean stop.
	var plugins sync.WaitGroup
	nctx, ncancel := context.WithCancel(context.WithoutCancel(gctx))
	defer ncancel()
	go func() {
		<-gctx.Done()
		plugins.Wait()
		ncancel()
	}()
	if sharedPods != nil {
		// Stopped with the nodes, after the plugins.
		g.Go(func() error { return sharedPods.Run(nctx, workers) })
	}
	for i := range o.Count {
		cfg := virtualnode.Config{
			Name:       o.Name,
			Root:       root,
			Client:     client,
			Informers:  shared,
			PodRouter:  router,
			SharedPods: sharedPods,
			// One List of DeviceClasses answers the nodes starting
			// together.
			DeviceClasses: classes,
			NewBackend:    newBackend,
			Resources:     res,
			Taints:        taints,
			// Host processes: the node's own NoSchedule taints are
			// enforced at admission too (virtualnode.Config).
			HostProcesses: o.Backend == "process",
			NodeIP:        o.NodeIP,
			Port:          o.Port,
			// Without a node API nothing could read the nodes' metrics.
			NoMetrics:    o.Port < 0,
			ClientCAFile: o.ClientCAFile,
			TLSCertFile:  o.TLSCertFile,
			TLSKeyFile:   o.TLSKeyFile,
			Logger:       log,

			PodSyncWorkers:      workers,
			DeviceGracePeriod:   o.DeviceGracePeriod,
			DeviceAdmissionWait: o.DeviceAdmissionWait,
			DRAWipingDelay:      o.DRAWipingDelay,
		}
		cfg.HeartbeatClient = clients.Heartbeat
		cfg.TokenReviewClient, cfg.SubjectAccessReviewClient = clients.TokenReviews, clients.SubjectAccessReviews
		if o.Count > 1 {
			cfg.Name = o.Name + "-" + strconv.Itoa(i)
			cfg.Root = nodeRoots[i]
			if o.Port > 0 {
				cfg.Port = o.Port + i
			}
		}
		cfg.EventRecorder = virtualnode.EventRecorder(events, cfg.Name)
		np := &nodePlugin{up: make(chan struct{})}
		if pluginCfg != nil {
			pc, err := pluginCfg(cfg.Root, cfg.Name)
			if err != nil {
				return err
			}
			plog := log.With("node", cfg.Name, "component", "plugin")
			np.setUp(gctx, &cfg, pc, plog)
			popts := pluginrun.Options{Clock: o.PluginClock, DRA: draFront, NoClaimGuard: true, FollowAllocated: true}
			plugins.Add(1)
			g.Go(func() error {
				defer plugins.Done()
				return np.run(gctx, cfg.Name, pc, popts, registration == RegistrationInProcess, plog)
			})
		}
		g.Go(func() error {
			return portHint(o, virtualnode.Run(nctx, cfg, func(n *virtualnode.Node) {
				mu.Lock()
				nodes = append(nodes, n)
				all := len(nodes) == o.Count
				mu.Unlock()
				if all && o.Count > 1 {
					returnStartupMemory(log, o.Count)
				}
				np.nodeRuns(n)
				if all && started != nil {
					started(nodes)
				}
			}))
		})
	}
	return g.Wait()
}

// nodePlugin is a node's in-process plugin (--plugin-config), which
// starts once up closes.
type nodePlugin struct {
	up    chan struct{}
	node  *virtualnode.Node // set before up closes
	early bool              // it starts before the node registers
	// served hands the plugin's device plugin server over once it
	// serves.
	served chan *deviceplugin.Server
}

// setUp sets the node's cfg up for the plugin pc; call it before the
// node runs. A plugin without the dra front needs nothing of the API
// server: it starts once the node's kubelet side runs, and the node
// registers its Node with the plugin's devices
// (virtualnode.Config.BeforeRegistration), as a kubelet does whose device
// plugins registered before its Node. The dra front publishes
// ResourceSlices owned by the Node: a plugin with it starts once the node
// runs (nodeRuns), as a plugin DaemonSet starts on a running kubelet.
// Either way the node serves its registration socket by then: started
// before, the plugin would log a failed registration first.
func (p *nodePlugin) setUp(ctx context.Context, cfg *virtualnode.Config, pc *config.PluginConfig, log *slog.Logger) {
	p.served = make(chan *deviceplugin.Server, 1)
	if p.early = !pc.UsesFront(config.FrontDRA); p.early {
		cfg.BeforeRegistration = func(nctx context.Context, n *virtualnode.Node) error {
			p.node = n
			close(p.up)
			waitListed(nctx, ctx, n.DeviceManager(), p.served, pluginListWait, log)
			return nil
		}
	}
}

// run serves the plugin until ctx ends, once the node lets it start.
func (p *nodePlugin) run(ctx context.Context, node string, pc *config.PluginConfig, popts pluginrun.Options, inProcess bool, log *slog.Logger) error {
	select {
	case <-p.up:
	case <-ctx.Done():
		return nil
	}
	// The plugin's environment is the node's, not the process's:
	// $NODE_NAME, $POD_UID and the directories are the node's own
	// (pluginConfig).
	popts.Getenv = func(string) string { return "" }
	if inProcess {
		popts.InProcess = p.node.DeviceManager()
	}
	if err := pluginrun.RunWith(ctx, log, pc, func(s pluginrun.Served) { p.served <- s.Server }, popts); err != nil && ctx.Err() == nil {
		return fmt.Errorf("node %s: in-process plugin: %w", node, err)
	}
	return nil
}

// nodeRuns lets a plugin that waits for its node to run start.
func (p *nodePlugin) nodeRuns(n *virtualnode.Node) {
	if !p.early {
		p.node = n
		close(p.up)
	}
}

// pluginListWait bounds how long a node waits for its in-process plugin
// to register and list its devices before it registers its Node: a plugin
// slower than that has its devices written to the Node's status once it
// lists them.
const pluginListWait = 10 * time.Second

// waitListed returns once the device manager mgr has the devices of every
// resource of the plugin's server (the one served hands over, nil for
// none): each registered and listed. It returns earlier when ctx or
// pluginsCtx ends, or after wait (logged).
func waitListed(ctx, pluginsCtx context.Context, mgr *devicemanager.Manager, served <-chan *deviceplugin.Server, wait time.Duration, log *slog.Logger) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var srv *deviceplugin.Server
	select {
	case srv = <-served:
	case <-ctx.Done():
		return
	case <-pluginsCtx.Done():
		return
	case <-timer.C:
		log.Info("Registering the node before its in-process plugin started", "waited", wait)
		return
	}
	if srv == nil {
		return
	}
	changed, cancel := mgr.Subscribe()
	defer cancel()
	for {
		listed := map[string]bool{}
		for _, r := range mgr.Resources() {
			listed[r.Name] = r.Connected
		}
		var missing []string
		for _, st := range srv.Status() {
			if !listed[st.Name] {
				missing = append(missing, st.Name)
			}
		}
		if len(missing) == 0 {
			return
		}
		select {
		case _, ok := <-changed:
			if !ok {
				return // the device manager stopped
			}
		case <-ctx.Done():
			return
		case <-pluginsCtx.Done():
			return
		case <-timer.C:
			log.Info("Registering the node before its in-process plugin listed its devices; they go in the node status once listed", "resources", missing, "waited", wait)
			return
		}
	}
}

// returnStartupMemory hands the memory the nodes' start left unused back
// to the operating system, once every node of a --count above 1 runs (and
// before the last one's plugin starts, where its plugins have the dra
// front). Nodes registering together make
// a burst of short-lived allocations, their first API writes, lists and
// patches, that the process's steady state never repeats: the Go runtime
// keeps what they leave as idle heap, and returns it only gradually. A
// thousand nodes left about 70 KiB each (docs/performance.md).
func returnStartupMemory(log *slog.Logger, count int) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	debug.FreeOSMemory()
	runtime.ReadMemStats(&after)
	log.Debug("Returned the nodes' start-up memory to the system", "nodes", count,
		"returnedMiB", (int64(after.HeapReleased)-int64(before.HeapReleased))>>20, "heapInUseMiB", after.HeapInuse>>20)
}

// portHint adds to a node's error, when another process serves its node
// API port, which flag chooses the port.
func portHint(o Options, err error) error {
	if !errors.Is(err, virtualnode.ErrPortInUse) {
		return err
	}
	if o.Count > 1 {
		return fmt.Errorf("%w; node i of --count %d serves on --port+i: pass a --port with the %d ports from it free, or --port -1 for no node API", err, o.Count, o.Count)
	}
	return fmt.Errorf("%w; pass --port with a free port, or --port -1 for no node API", err)
}
