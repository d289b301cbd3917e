// Command kubelet-devicemanager runs the kubelet's own device manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager, Kubernetes v1.37.0) on
// its own, so dpkit's tests can check that device plugins work with the
// upstream code rather than with dpkit's emulation of it.
//
// The upstream ManagerImpl serves the registration socket
// <plugin-dir>/kubelet.sock, connects to plugins, runs ListAndWatch, keeps
// its checkpoint, and allocates devices. Pods are admitted through the
// upstream topology manager's admit handler (the kubelet's path: policy
// "none" calls the device manager's Allocate for each init and app
// container), then GetDeviceRunContainerOptions gives what the container
// runtime would receive. With --registry-dir, the upstream plugin manager
// (plugin watcher and reconciler) watches that directory and hands device
// plugins to the same ManagerImpl, as the kubelet does with
// plugins_registry.
//
// Protocol: one JSON object per line on stdout; commands one per line on
// stdin. Logs (klog) go to stderr. test/differential/cmd/dpkit-devicemanager
// speaks the same protocol over dpkit's device manager, so one client
// drives both (test/differential); change the two together.
//
//	{"event":"ready","socket":...,"processStart":NS,"serverStart":NS,"time":NS}
//	{"event":"capacity","capacity":{R:N},"allocatable":{R:N},"deleted":[R],"time":NS}
//	    printed whenever GetCapacity's answer changes (polled every --poll)
//
//	allocate RESOURCE N [POD]  -> {"event":"allocation","pod":..,"uid":..,"container":"main",
//	                               "deviceIDs":{R:[ids]},"envs":{..},"mounts":[..],
//	                               "devices":[..],"annotations":{..},"cdiDevices":[..]}
//	                              or {"event":"allocation","pod":..,"error":"..."}
//	admit POD-JSON             -> {"event":"admission","pod":..,"uid":..,"admitted":true,
//	                               "containers":[{"name":..,"deviceIDs":{R:[ids]}}]}
//	                              or {"event":"admission","pod":..,"uid":..,"admitted":false,
//	                               "reason":..,"error":..}
//	start POD CONTAINER        -> {"event":"start","pod":..,"container":..,"options":{"envs":..,
//	                               "mounts":..,"devices":..,"annotations":..,"cdiDevices":..}}
//	                              (options null when the container has no devices)
//	                              or {"event":"start","pod":..,"container":..,"error":"..."}
//	delete POD                 -> {"event":"deleted","pod":..}
//	capacity                   -> {"event":"capacity",...} now, changed or not
//
// POD-JSON is {"name":..,"uid":..,"initContainers":[C..],"containers":[C..]}
// with C = {"name":..,"restartable":bool,"limits":{R:N}} (requests equal
// limits; restartable makes an init container a sidecar). admit runs the
// kubelet's admission (the topology manager's admit handler, which calls
// the device manager's Allocate for every init and app container); a pod
// of the same name and UID that is already known (from --pods) is admitted
// again, as a restarted kubelet admits the pods it finds. start is what the
// kubelet does before starting a container: GetDeviceRunContainerOptions,
// which calls PreStartContainer on plugins that asked for it. deviceIDs and
// the options' lists are sorted (the manager's own order is random).
//
// --pods FILE names a JSON array of POD-JSON: the pods a restarted kubelet
// knows from the start. They are active from the start (their devices are
// not released) but are not admitted until an admit command says so.
//
// Times are Unix nanoseconds. SIGINT or SIGTERM stops the manager; SIGKILL
// stands for a kubelet crash.
//
// The exported constructor NewManagerImpl hard-codes the socket to
// /var/lib/kubelet/device-plugins/kubelet.sock; it is a one-line wrapper of
// newManagerImpl(logger, socketPath, ...), which the upstream unit tests
// call with a temporary socket. This program calls that same function
// through a linkname directive so the socket can live in a test's
// directory; nothing else of the manager is bypassed. See
// docs/upstream-interop.md.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	_ "unsafe" // go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/record"
	"k8s.io/component-base/version"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	pluginwatcherapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

func main() {
	processStart := time.Now()
	if err := run(processStart); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-devicemanager:", err)
		os.Exit(1)
	}
}

type options struct {
	pluginDir   string
	registryDir string
	policy      string
	scope       string
	numaNodes   string
	pods        string
	poll        time.Duration
}

func run(processStart time.Time) error {
	var o options
	fs := flag.CommandLine
	fs.StringVar(&o.pluginDir, "plugin-dir", pluginapi.DevicePluginPath, "device plugin directory; the registration socket is <plugin-dir>/kubelet.sock")
	fs.StringVar(&o.registryDir, "registry-dir", "", "plugin watcher directory (the kubelet's plugins_registry); empty: no plugin watcher")
	fs.StringVar(&o.policy, "topology-policy", topologymanager.PolicyNone, "topology manager policy: none, best-effort, restricted, single-numa-node")
	fs.StringVar(&o.scope, "topology-scope", topologymanager.ContainerTopologyScope, "topology manager scope: container or pod")
	fs.StringVar(&o.numaNodes, "numa-nodes", "", "NUMA node IDs of the machine, e.g. 0,1")
	fs.StringVar(&o.pods, "pods", "", "JSON file listing the pods known at start (a restarted kubelet's pods); see the protocol")
	fs.DurationVar(&o.poll, "poll", 5*time.Millisecond, "how often GetCapacity is polled for changes")
	showVersion := fs.Bool("version", false, "print the Kubernetes version and exit")
	klog.InitFlags(fs)
	flag.Parse()
	if *showVersion {
		fmt.Println("Kubernetes " + version.Get().GitVersion)
		return nil
	}
	if flag.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if !filepath.IsAbs(o.pluginDir) {
		abs, err := filepath.Abs(o.pluginDir)
		if err != nil {
			return err
		}
		o.pluginDir = abs
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	var topology []cadvisorapi.Node
	if o.numaNodes != "" {
		for _, s := range strings.Split(o.numaNodes, ",") {
			id, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("--numa-nodes: %q is not a node ID: %w", s, err)
			}
			topology = append(topology, cadvisorapi.Node{Id: id})
		}
	}
	tm, err := topologymanager.NewManager(logger, topology, o.policy, o.scope, nil)
	if err != nil {
		return fmt.Errorf("topology manager: %w", err)
	}
	socket := filepath.Join(o.pluginDir, filepath.Base(pluginapi.KubeletSocket))
	m, err := newManagerImpl(logger, socket, topology, tm)
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}
	tm.AddHintProvider(logger, m)

	out := &printer{enc: json.NewEncoder(os.Stdout)}
	pods := &activePods{byName: map[string]*v1.Pod{}}
	if o.pods != "" {
		known, err := readPods(o.pods)
		if err != nil {
			return err
		}
		for _, p := range known {
			pods.byName[p.Name] = p
		}
	}
	serverStart := time.Now()
	// sourcesReady says all sources are seen, as a kubelet's does once it
	// has listed its pods: inactive pods' devices are then released.
	if err := m.Start(logger, pods.list, config.NewSourcesReady(func(sets.Set[string]) bool { return true }),
		containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("start device manager: %w", err)
	}
	defer func() {
		if err := m.Stop(logger); err != nil {
			logger.Error(err, "Stop device manager")
		}
	}()

	if o.registryDir != "" {
		if err := os.MkdirAll(o.registryDir, 0o750); err != nil {
			return err
		}
		pm := pluginmanager.NewPluginManager(o.registryDir, &record.FakeRecorder{})
		pm.AddHandler(pluginwatcherapi.DevicePlugin, m.GetWatcherHandler())
		stopCh := make(chan struct{})
		defer close(stopCh)
		go pm.Run(ctx, config.NewSourcesReady(func(sets.Set[string]) bool { return true }), stopCh)
	}

	out.print(map[string]any{
		"event": "ready", "socket": socket, "registryDir": o.registryDir,
		"processStart": processStart.UnixNano(), "serverStart": serverStart.UnixNano(), "time": time.Now().UnixNano(),
	})

	a := &admitter{ctx: ctx, m: m, tm: tm, pods: pods, out: out}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	tick := time.NewTicker(o.poll)
	defer tick.Stop()
	var last string
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			last = a.capacity(last, false)
		case line, ok := <-lines:
			if !ok {
				// stdin closed: keep serving until signalled, so a
				// caller that does not use commands may close it.
				lines = nil
				continue
			}
			if strings.TrimSpace(line) == "capacity" {
				last = a.capacity(last, true)
				continue
			}
			a.command(line)
		}
	}
}

// printer writes one JSON object per line.
type printer struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (p *printer) print(v any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, "kubelet-devicemanager: write stdout:", err)
	}
}

// activePods is what the kubelet's pod manager would answer: the pods
// admitted and not deleted.
type activePods struct {
	mu     sync.Mutex
	byName map[string]*v1.Pod
}

func (a *activePods) list() []*v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Collect(maps.Values(a.byName))
}

type admitter struct {
	ctx  context.Context
	m    *devicemanager.ManagerImpl
	tm   topologymanager.Manager
	pods *activePods
	out  *printer
	seq  int
}

func (a *admitter) capacity(last string, always bool) string {
	capacity, allocatable, deleted := a.m.GetCapacity(klog.FromContext(a.ctx))
	ev := map[string]any{"event": "capacity", "capacity": counts(capacity), "allocatable": counts(allocatable)}
	key, _ := json.Marshal(ev)
	if len(deleted) > 0 {
		slices.Sort(deleted)
		ev["deleted"] = deleted
	}
	if string(key) == last && len(deleted) == 0 && !always {
		return last
	}
	ev["time"] = time.Now().UnixNano()
	a.out.print(ev)
	return string(key)
}

func counts(l v1.ResourceList) map[string]int64 {
	out := make(map[string]int64, len(l))
	for k, q := range l {
		out[string(k)] = q.Value()
	}
	return out
}

func (a *admitter) command(line string) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return
	}
	switch {
	case f[0] == "allocate" && (len(f) == 3 || len(f) == 4):
		n, err := strconv.Atoi(f[2])
		if err != nil || n < 0 {
			a.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("allocate: count %q is not a non-negative integer", f[2])})
			return
		}
		a.seq++
		name := fmt.Sprintf("pod-%d", a.seq)
		if len(f) == 4 {
			name = f[3]
		}
		a.allocate(name, f[1], n)
	case f[0] == "admit" && len(f) >= 2:
		var spec podSpec
		if err := json.Unmarshal([]byte(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "admit"))), &spec); err != nil {
			a.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("admit: %v", err)})
			return
		}
		a.admit(spec)
	case f[0] == "start" && len(f) == 3:
		a.start(f[1], f[2])
	case f[0] == "delete" && len(f) == 2:
		a.pods.mu.Lock()
		_, ok := a.pods.byName[f[1]]
		delete(a.pods.byName, f[1])
		a.pods.mu.Unlock()
		if !ok {
			a.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("delete: no pod %q", f[1])})
			return
		}
		// The kubelet frees devices of pods no longer active on its next
		// admission; this does it now.
		a.m.UpdateAllocatedDevices(klog.FromContext(a.ctx))
		a.out.print(map[string]any{"event": "deleted", "pod": f[1]})
	default:
		a.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("unknown command %q; want: allocate RESOURCE N [POD] | admit POD-JSON | start POD CONTAINER | delete POD | capacity", line)})
	}
}

// podSpec is the protocol's description of a pod.
type podSpec struct {
	Name           string          `json:"name"`
	UID            string          `json:"uid"`
	InitContainers []containerSpec `json:"initContainers,omitempty"`
	Containers     []containerSpec `json:"containers"`
}

type containerSpec struct {
	Name        string           `json:"name"`
	Restartable bool             `json:"restartable,omitempty"`
	Limits      map[string]int64 `json:"limits,omitempty"`
}

func (s podSpec) pod() *v1.Pod {
	container := func(c containerSpec) v1.Container {
		rl := v1.ResourceList{}
		for r, n := range c.Limits {
			rl[v1.ResourceName(r)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		out := v1.Container{Name: c.Name, Resources: v1.ResourceRequirements{Limits: rl, Requests: rl.DeepCopy()}}
		if c.Restartable {
			always := v1.ContainerRestartPolicyAlways
			out.RestartPolicy = &always
		}
		return out
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: "default", UID: types.UID(s.UID)}}
	for _, c := range s.InitContainers {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, container(c))
	}
	for _, c := range s.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, container(c))
	}
	return pod
}

func readPods(path string) ([]*v1.Pod, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--pods: %w", err)
	}
	var specs []podSpec
	if err := json.Unmarshal(data, &specs); err != nil {
		return nil, fmt.Errorf("--pods %s: %w", path, err)
	}
	pods := make([]*v1.Pod, 0, len(specs))
	for _, s := range specs {
		if s.Name == "" || s.UID == "" {
			return nil, fmt.Errorf("--pods %s: every pod needs a name and a uid", path)
		}
		pods = append(pods, s.pod())
	}
	return pods, nil
}

// allocate admits a pod with one container asking for n of resource
// through the topology manager's admit handler, the kubelet's path, and
// prints the container's devices and runtime options.
func (a *admitter) allocate(name, res string, n int) {
	a.pods.mu.Lock()
	_, dup := a.pods.byName[name]
	a.pods.mu.Unlock()
	if dup {
		a.out.print(map[string]any{"event": "allocation", "pod": name, "error": fmt.Sprintf("pod %q exists; delete it first", name)})
		return
	}
	pod := podSpec{
		Name:       name,
		UID:        fmt.Sprintf("uid-%s-%d", name, time.Now().UnixNano()),
		Containers: []containerSpec{{Name: "main", Limits: map[string]int64{res: int64(n)}}},
	}.pod()
	ev := map[string]any{"event": "allocation", "pod": name, "uid": string(pod.UID), "container": "main"}
	if result := a.admitPod(pod); !result.Admit {
		ev["reason"] = result.Reason
		ev["error"] = result.Message
		a.out.print(ev)
		return
	}
	c := &pod.Spec.Containers[0]
	opts, err := a.m.GetDeviceRunContainerOptions(a.ctx, pod, c)
	if err != nil {
		ev["error"] = err.Error()
		a.out.print(ev)
		return
	}
	ev["deviceIDs"] = a.deviceIDs(pod, c.Name)
	if opts != nil {
		maps.Copy(ev, runOptions(opts))
	}
	a.out.print(ev)
}

// admitPod runs the kubelet's admission for pod. The pod is active while
// it is being admitted, as in the kubelet, where the pod manager knows the
// pod before admission; a rejected pod is no longer active.
func (a *admitter) admitPod(pod *v1.Pod) lifecycle.PodAdmitResult {
	a.pods.mu.Lock()
	a.pods.byName[pod.Name] = pod
	a.pods.mu.Unlock()
	result := a.tm.Admit(a.ctx, &lifecycle.PodAdmitAttributes{Pod: pod, Operation: lifecycle.AddOperation})
	if !result.Admit {
		a.pods.mu.Lock()
		delete(a.pods.byName, pod.Name)
		a.pods.mu.Unlock()
	}
	return result
}

// admit admits a pod described by the protocol; a known pod (same name
// and UID) is admitted again.
func (a *admitter) admit(spec podSpec) {
	ev := map[string]any{"event": "admission", "pod": spec.Name, "uid": spec.UID}
	if spec.Name == "" || spec.UID == "" {
		ev["admitted"], ev["error"] = false, "admit: the pod needs a name and a uid"
		a.out.print(ev)
		return
	}
	a.pods.mu.Lock()
	known, dup := a.pods.byName[spec.Name]
	a.pods.mu.Unlock()
	if dup && string(known.UID) != spec.UID {
		ev["admitted"], ev["error"] = false, fmt.Sprintf("pod %q exists with another uid; delete it first", spec.Name)
		a.out.print(ev)
		return
	}
	pod := spec.pod()
	if result := a.admitPod(pod); !result.Admit {
		ev["admitted"], ev["reason"], ev["error"] = false, result.Reason, result.Message
		a.out.print(ev)
		return
	}
	var containers []map[string]any
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		containers = append(containers, map[string]any{"name": c.Name, "deviceIDs": a.deviceIDs(pod, c.Name)})
	}
	ev["admitted"], ev["containers"] = true, containers
	a.out.print(ev)
}

// start does what the kubelet does before it starts a container: ask the
// device manager for the container's runtime options, which calls
// PreStartContainer on the plugins that asked for it.
func (a *admitter) start(name, container string) {
	ev := map[string]any{"event": "start", "pod": name, "container": container}
	a.pods.mu.Lock()
	pod := a.pods.byName[name]
	a.pods.mu.Unlock()
	var c *v1.Container
	if pod != nil {
		for i := range pod.Spec.InitContainers {
			if pod.Spec.InitContainers[i].Name == container {
				c = &pod.Spec.InitContainers[i]
			}
		}
		for i := range pod.Spec.Containers {
			if pod.Spec.Containers[i].Name == container {
				c = &pod.Spec.Containers[i]
			}
		}
	}
	if c == nil {
		ev["error"] = fmt.Sprintf("start: no pod %q with a container %q", name, container)
		a.out.print(ev)
		return
	}
	opts, err := a.m.GetDeviceRunContainerOptions(a.ctx, pod, c)
	switch {
	case err != nil:
		ev["error"] = err.Error()
	case opts == nil:
		ev["options"] = nil
	default:
		ev["options"] = runOptions(opts)
	}
	a.out.print(ev)
}

func (a *admitter) deviceIDs(pod *v1.Pod, container string) map[string][]string {
	ids := map[string][]string{}
	for r, devs := range a.m.GetDevices(string(pod.UID), container) {
		ids[r] = slices.Sorted(maps.Keys(devs))
	}
	return ids
}

// runOptions is what the container runtime would receive, in the
// protocol's form: lists sorted by container path (or name), since the
// manager builds them from Go maps.
func runOptions(opts *devicemanager.DeviceRunContainerOptions) map[string]any {
	envs := map[string]string{}
	for _, e := range opts.Envs {
		envs[e.Name] = e.Value
	}
	ann := map[string]string{}
	for _, e := range opts.Annotations {
		ann[e.Name] = e.Value
	}
	var mounts, devices []map[string]any
	for _, mt := range opts.Mounts {
		mounts = append(mounts, map[string]any{"containerPath": mt.ContainerPath, "hostPath": mt.HostPath, "readOnly": mt.ReadOnly})
	}
	for _, d := range opts.Devices {
		devices = append(devices, map[string]any{"containerPath": d.PathInContainer, "hostPath": d.PathOnHost, "permissions": d.Permissions})
	}
	byPath := func(x, y map[string]any) int {
		return strings.Compare(x["containerPath"].(string), y["containerPath"].(string))
	}
	slices.SortFunc(mounts, byPath)
	slices.SortFunc(devices, byPath)
	var cdi []string
	for _, d := range opts.CDIDevices {
		cdi = append(cdi, d.Name)
	}
	slices.Sort(cdi)
	return map[string]any{"envs": envs, "annotations": ann, "mounts": mounts, "devices": devices, "cdiDevices": cdi}
}
