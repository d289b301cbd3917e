// Package cri is a virtual node backend that runs pods as real containers
// through a container runtime's CRI v1 API (containerd, CRI-O): one pod
// sandbox per pod, one container per container of the pod spec, with the
// devices, mounts and CDI devices the device plugins and DRA drivers gave.
//
// It is the part of a kubelet that talks to the runtime: the containers'
// probes and lifecycle hooks (probe.go, hooks.go), and what containers
// mount: emptyDir, hostPath, configMap, secret, downwardAPI and projected
// volumes under the pod's directory, the managed /etc/hosts, the
// termination message file, and the sandbox's DNS configuration and port
// mappings. No image credentials. The sandboxes it creates are
// labelled with the node's name (LabelNode) and carry the pod they run
// (AnnotationPod), so a restarted node adopts them. The runtime must not
// be shared with a kubelet: a kubelet lists every sandbox of the runtime
// and kills those of pods it does not know (HandlePodCleanups, "orphaned
// pod we had not seen before").
package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"

	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/volume"
)

// Labels and annotations on the sandboxes and containers the backend
// creates.
const (
	// LabelNode names the virtual node a sandbox belongs to.
	LabelNode = "dpkit.io/node"
	// LabelPodUID is the pod's UID, on sandboxes and containers.
	LabelPodUID = "dpkit.io/pod-uid"
	// LabelContainer is the container's name in the pod spec.
	LabelContainer = "dpkit.io/container"
	// AnnotationPod holds the pod (JSON, as the API server had it when
	// the node admitted it) on its sandbox, for adoption after a restart.
	AnnotationPod = "dpkit.io/pod"
)

// Defaults.
const (
	DefaultPollInterval   = time.Second
	DefaultBackoffInitial = podruntime.DefaultBackoffInitial
	// DefaultVolumeResync is the kubelet's sync period.
	DefaultVolumeResync = volume.DefaultResync
	// DefaultGracePeriod applies when a pod names none.
	DefaultGracePeriod = podruntime.DefaultGracePeriod
	// cdiEnv is the variable in which the node gives the process backend
	// the CDI devices of a container's claims (virtualnode.CDIDevicesEnv);
	// this backend passes them to the runtime as CDI devices instead.
	cdiEnv = "DPKIT_CDI_DEVICES"
)

// Config configures the backend.
type Config struct {
	backend.Config
	// Endpoint is the runtime's CRI socket: unix:///path or a path.
	Endpoint string
	// Node is the node's name; its sandboxes are labelled with it.
	Node string
	// LogDir holds the pods' log directories, <ns>_<name>_<uid>/, into
	// which the runtime writes <container>/<restartCount>.log. The
	// runtime must see it at the same path.
	LogDir string
	// PollInterval is how often the containers' states are read from the
	// runtime (the kubelet's relist period); 0 means 1s.
	PollInterval time.Duration
	// BackoffInitial is the first restart and image pull back-off,
	// doubling to 5 minutes; 0 means the kubelet's 10s.
	BackoffInitial time.Duration
	// DialTimeout bounds the first call to the runtime; 0 means 10s.
	DialTimeout time.Duration
	// RequestTimeout bounds each call to the runtime but image pulls, as
	// the kubelet's --runtime-request-timeout (sandbox creation gets
	// twice as long, a container's stop and a command's exec the grace
	// period or timeout more); 0 means the kubelet's 2m.
	RequestTimeout time.Duration
	// PodDir holds each pod's directory <uid>/, as the kubelet's
	// /var/lib/kubelet/pods: volumes/<plugin>/<volume>, etc-hosts and
	// containers/<name>/ (termination messages). The runtime must see it
	// at the same path. Empty means LogDir (the log directories are
	// named <ns>_<name>_<uid>, so the two never meet).
	PodDir string
	// SeccompDir holds the Localhost seccomp profiles pods name
	// (securityContext.seccompProfile.localhostProfile is a path below
	// it); empty means seccomp/ beside PodDir (the kubelet's
	// <root-dir>/seccomp).
	SeccompDir string
	// ClusterDNS are the cluster DNS servers of ClusterFirst pods (the
	// kubelet's --cluster-dns); without any such pods use the node's
	// resolver configuration, with a MissingClusterDNS event.
	ClusterDNS []string
	// ClusterDomain is the cluster's DNS domain (--cluster-domain).
	ClusterDomain string
	// ResolvConf is the node's resolver configuration, the base of pods'
	// DNS configuration (--resolv-conf); empty means /etc/resolv.conf.
	ResolvConf string
	// HostsFile is the node's hosts file, the base of hostNetwork pods'
	// /etc/hosts; empty means /etc/hosts.
	HostsFile string
	// DiskBackedVolumes writes secret, projected and downwardAPI volumes
	// and emptyDir{medium: Memory} to plain directories under PodDir,
	// where the kubelet (and by default this backend) mounts a tmpfs
	// for each, which needs the privilege to mount (root) and a mount
	// namespace shared with the runtime. Secrets and tokens then reach
	// the node's disk.
	DiskBackedVolumes bool
	// VolumeResync is how often ConfigMap, Secret, downward API and
	// token contents of running pods are written again (the kubelet's
	// sync period); 0 means a minute.
	VolumeResync time.Duration
	// CgroupRoot, when set, is the cgroupfs path (e.g. /dpkit) below
	// which each pod's sandbox and containers go, in pod<UID>, as the
	// kubelet's --cgroup-root (whose pods go to kubepods/<qos>/pod<UID>
	// below it): the runtime then measures each pod whole
	// (ListPodSandboxStats), and the backend removes the pod's cgroup
	// once its sandbox is gone. For a runtime with the cgroupfs cgroup
	// driver. Empty leaves sandboxes where the runtime puts them by
	// default (containerd: /k8s.io/<id>).
	CgroupRoot string

	// probeTicker, when set, paces the probe workers instead of their
	// period, the first probe included (tests): name is
	// "<container>/<Kind>".
	probeTicker func(name string, period time.Duration) (<-chan time.Time, func())
}

// Backend runs pods through a CRI runtime.
type Backend struct {
	cfg Config
	log *slog.Logger
	// klog is log for the CRI client, which takes its logger from the
	// context of each call (logctx).
	klog    klog.Logger
	rt      internalapi.RuntimeService
	img     internalapi.ImageManagerService
	runtime string // the runtime's name, the scheme of container IDs

	ctx    context.Context
	cancel context.CancelFunc

	pods podruntime.Workers[*podRun]
	mu   sync.Mutex
	// forgetting are the pods Forget is removing, left alone by
	// CleanupOrphans.
	forgetting map[types.UID]bool

	cpu cpuCache // CPU samples for usage in nano cores
}

var _ backend.Backend = (*Backend)(nil)

// ErrNotFound is wrapped by errors about unknown pods and containers.
var ErrNotFound = errors.New("not found")

// socketPath returns the path of a unix:// endpoint.
func socketPath(endpoint string) (string, error) {
	switch {
	case strings.HasPrefix(endpoint, "unix://"):
		return strings.TrimPrefix(endpoint, "unix://"), nil
	case strings.Contains(endpoint, "://"):
		return "", fmt.Errorf("endpoint %q: only unix:// sockets are supported, e.g. unix:///run/containerd/containerd.sock", endpoint)
	case endpoint == "":
		return "", errors.New("no CRI endpoint: give the runtime's socket, e.g. unix:///run/containerd/containerd.sock")
	}
	return endpoint, nil
}

// New connects to the runtime, checks that it answers CRI v1 and adopts
// the sandboxes of cfg.Node left by a previous run.
func New(ctx context.Context, cfg Config) (*Backend, error) {
	path, err := socketPath(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	if cfg.Node == "" {
		return nil, errors.New("cri backend: Config.Node is empty: name the node")
	}
	if cfg.LogDir == "" {
		return nil, errors.New("cri backend: Config.LogDir is empty: give the directory for the pods' logs")
	}
	if r := cfg.CgroupRoot; r != "" && (!filepath.IsAbs(r) || filepath.Clean(r) != r || r == "/") {
		return nil, fmt.Errorf("cri backend: Config.CgroupRoot %q: give a clean absolute cgroupfs path below the root, e.g. /dpkit", r)
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.BackoffInitial <= 0 {
		cfg.BackoffInitial = DefaultBackoffInitial
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = runtimeRequestTimeout
	}
	if cfg.PodDir == "" {
		cfg.PodDir = cfg.LogDir
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = podruntime.DefaultResolvConf
	}
	if cfg.HostsFile == "" {
		cfg.HostsFile = "/etc/hosts"
	}
	if cfg.VolumeResync <= 0 {
		cfg.VolumeResync = DefaultVolumeResync
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.LogDir, 0o750); err != nil {
		return nil, fmt.Errorf("cri backend: log directory: %w", err)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("cri backend: %s: %w (is containerd or CRI-O running, and is this its CRI socket?)", cfg.Endpoint, err)
	}
	if path, err = filepath.Abs(path); err != nil {
		return nil, fmt.Errorf("cri backend: %s: %w", cfg.Endpoint, err)
	}
	b := &Backend{
		cfg: cfg, log: log, klog: logr.FromSlogHandler(log.Handler()),
		forgetting: map[types.UID]bool{},
	}
	if err := b.connect(ctx, "unix://"+path); err != nil {
		return nil, fmt.Errorf("cri backend: no CRI v1 runtime answers on %s (is containerd or CRI-O running, with its CRI plugin enabled?): %w", cfg.Endpoint, err)
	}
	vctx, cancel := context.WithTimeout(b.logctx(ctx), cfg.DialTimeout)
	defer cancel()
	v, err := b.rt.Version(vctx, kubeRuntimeAPIVersion)
	if err != nil {
		_ = b.closeClients()
		return nil, fmt.Errorf("cri backend: no CRI v1 runtime answers on %s (is containerd or CRI-O running, with its CRI plugin enabled?): %w", cfg.Endpoint, err)
	}
	b.runtime = v.RuntimeName
	log.Info("Container runtime", "name", v.RuntimeName, "version", v.RuntimeVersion, "criVersion", v.RuntimeApiVersion)
	b.ctx, b.cancel = context.WithCancel(context.Background())
	if err := b.adopt(ctx); err != nil {
		b.cancel()
		_ = b.closeClients()
		return nil, err
	}
	return b, nil
}

// kubeRuntimeAPIVersion is the version the kubelet sends in its Version
// calls (pkg/kubelet/kuberuntime).
const kubeRuntimeAPIVersion = "0.1.0"

// connect builds the kubelet's CRI clients (k8s.io/cri-client), whose
// first call, CRI v1's Version, is bounded by DialTimeout, and every
// later one by RequestTimeout. They do without tracing (no otelgrpc
// stats handler) and without the alpha CRIListStreaming lists.
func (b *Backend) connect(ctx context.Context, endpoint string) error {
	ctx, cancel := context.WithTimeout(b.logctx(ctx), b.cfg.DialTimeout)
	defer cancel()
	rt, err := remote.NewRemoteRuntimeServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(b.cfg.RequestTimeout).
		WithTracerProvider(nil).
		Build(ctx)
	if err != nil {
		return err
	}
	img, err := remote.NewRemoteImageServiceBuilder().
		WithEndpoint(endpoint).
		WithConnectionTimeout(b.cfg.RequestTimeout).
		WithTracerProvider(nil).
		Build(ctx)
	if err != nil {
		_ = rt.Close(ctx)
		return err
	}
	b.rt, b.img = rt, img
	return nil
}

// closeClients closes the connections of the CRI clients.
func (b *Backend) closeClients() error {
	ctx := b.logctx(context.Background())
	return errors.Join(b.rt.Close(ctx), b.img.Close(ctx))
}

// logctx is ctx carrying the backend's logger for the CRI client, which
// logs its failed calls (Error) and its calls (V(10)) with the logger of
// the call's context, and else with klog's global one.
func (b *Backend) logctx(ctx context.Context) context.Context {
	return klog.NewContext(ctx, b.klog)
}

// adopt takes over the sandboxes of this node a previous run left.
func (b *Backend) adopt(ctx context.Context) error {
	items, err := b.rt.ListPodSandbox(b.logctx(ctx), &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{LabelNode: b.cfg.Node},
	})
	if err != nil {
		return fmt.Errorf("cri backend: listing sandboxes: %w", err)
	}
	// The newest sandbox of a pod wins; older ones are removed.
	sort.Slice(items, func(i, j int) bool { return items[i].CreatedAt > items[j].CreatedAt })
	for _, sb := range items {
		var pod corev1.Pod
		if err := json.Unmarshal([]byte(sb.Annotations[AnnotationPod]), &pod); err != nil || pod.UID == "" {
			b.log.Warn("Removing a sandbox without a readable pod", "sandbox", sb.Id, "err", err)
			b.removeSandbox(ctx, sb.Id)
			continue
		}
		if _, ok := b.pods.Get(pod.UID); ok {
			b.removeSandbox(ctx, sb.Id)
			continue
		}
		pr := newPodRun(b, &pod)
		pr.sandboxID = sb.Id
		if err := pr.adoptContainers(ctx); err != nil {
			return err
		}
		b.pods.Add(pod.UID, func() *podRun { return pr })
		b.log.Info("Adopted a pod", "pod", pod.Namespace+"/"+pod.Name, "sandbox", sb.Id)
	}
	for _, pr := range b.pods.All() {
		b.pods.Go(b.ctx, pr)
	}
	return nil
}

// removeSandbox stops and removes a sandbox and its containers.
func (b *Backend) removeSandbox(ctx context.Context, id string) {
	if err := b.rt.StopPodSandbox(b.logctx(ctx), id); err != nil {
		b.log.Warn("Stopping a sandbox", "sandbox", id, "err", err)
	}
	if err := b.rt.RemovePodSandbox(b.logctx(ctx), id); err != nil {
		b.log.Warn("Removing a sandbox", "sandbox", id, "err", err)
	}
}

// podCgroup is the cgroup parent of the pod's sandboxes: pod<UID> below
// CgroupRoot, or "" (the runtime's default) without one.
func (b *Backend) podCgroup(uid types.UID) string {
	if b.cfg.CgroupRoot == "" {
		return ""
	}
	return path.Join(b.cfg.CgroupRoot, "pod"+string(uid))
}

// removePodCgroup removes the pod's cgroup in every hierarchy once its
// sandbox is gone, as the kubelet's pod container manager does; the
// runtime removed the sandbox's and containers' own below it.
func (b *Backend) removePodCgroup(pod *corev1.Pod) {
	cg := b.podCgroup(pod.UID)
	if cg == "" {
		return
	}
	mounts, err := procfs.CgroupMounts()
	if err != nil {
		b.log.Warn("Removing the pod's cgroup", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		return
	}
	for _, m := range mounts {
		if err := procfs.RemoveTree(filepath.Join(m, cg)); err != nil {
			b.log.Warn("Removing the pod's cgroup", "pod", pod.Namespace+"/"+pod.Name, "err", err)
		}
	}
}

// Close stops the backend's goroutines; the containers keep running and
// the next run adopts them.
func (b *Backend) Close() error {
	b.cancel()
	b.pods.Wait()
	return b.closeClients()
}

// CreatePod implements backend.Backend.
func (b *Backend) CreatePod(_ context.Context, pod *corev1.Pod) error {
	return b.pods.Create(b.ctx, pod.UID, func() *podRun { return newPodRun(b, pod.DeepCopy()) }, nil)
}

// DeletePod implements backend.Backend: the containers are stopped with
// the pod's grace period, then the sandbox is stopped and removed.
func (b *Backend) DeletePod(_ context.Context, pod *corev1.Pod) error {
	b.pods.Delete(pod)
	return nil
}

// Forget implements backend.Backend: what still runs is removed, and the
// pod's logs.
func (b *Backend) Forget(ctx context.Context, pod *corev1.Pod) error {
	// Marked forgetting before it leaves the runs, so that
	// CleanupOrphans, which looks at the runs first, sees it in one.
	b.mu.Lock()
	b.forgetting[pod.UID] = true
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(b.forgetting, pod.UID)
		b.mu.Unlock()
	}()
	// Not past the backend's end: what still runs is the next run's.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(b.ctx, cancel)()
	pr, found, err := b.pods.Forget(ctx, pod.UID)
	if !found || b.ctx.Err() != nil {
		return nil
	}
	if err != nil {
		return err
	}
	if err := os.RemoveAll(pr.logDir()); err != nil {
		return fmt.Errorf("removing the pod's logs: %w", err)
	}
	if err := volume.RemovePodDir(pr.podDir()); err != nil {
		return fmt.Errorf("removing the pod's directory: %w", err)
	}
	return nil
}

// CleanupOrphans implements backend.OrphanCleaner: the directories of
// pods the backend does not run and known does not report, under the pod
// and log directories, are removed, their tmpfs and subPath mounts
// unmounted first (the kubelet's cleanupOrphanedPodDirs). A pod deleted
// while the node was down whose sandbox is gone too left them: without
// this its Secret volumes stayed mounted on the node.
func (b *Backend) CleanupOrphans(_ context.Context, known func(types.UID) bool) error {
	var errs []error
	for _, dir := range slices.Compact([]string{b.cfg.PodDir, b.cfg.LogDir}) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			// <uid> is a pod's directory, <namespace>_<name>_<uid> its
			// logs (names and namespaces have no "_").
			name, logs := e.Name(), false
			if parts := strings.Split(name, "_"); len(parts) == 3 {
				name, logs = parts[2], true
			}
			uid := types.UID(name)
			if b.running(uid) || known(uid) {
				continue
			}
			path := filepath.Join(dir, e.Name())
			b.log.Info("Removing what a deleted pod left", "path", path)
			if logs {
				err = os.RemoveAll(path)
			} else {
				err = volume.RemovePodDir(path)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// running reports whether the backend runs the pod, or is removing it.
func (b *Backend) running(uid types.UID) bool {
	if _, ok := b.pods.Get(uid); ok {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.forgetting[uid]
}

// Pods implements backend.Backend.
func (b *Backend) Pods() []*corev1.Pod { return b.pods.Pods() }

// get returns the run of a pod, nil if none.
func (b *Backend) get(uid types.UID) *podRun {
	pr, _ := b.pods.Get(uid)
	return pr
}

// byName returns the run of a pod, nil if none; the newest wins.
func (b *Backend) byName(namespace, name string) *podRun {
	pr, _ := b.pods.ByName(namespace, name)
	return pr
}

// containerID is the ID the kubelet reports: <runtime>://<id>.
func (b *Backend) containerID(id string) string {
	if id == "" {
		return ""
	}
	return b.runtime + "://" + id
}

func podLogDir(root string, pod *corev1.Pod) string {
	return filepath.Join(root, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID))
}
