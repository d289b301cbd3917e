// Command dpkit-devicemanager runs dpkit's device manager the way dpkit
// kubelet and dpkit node run it (pkg/devicehost: the device manager on
// <root>/device-plugins/kubelet.sock, the plugin watcher on
// <root>/plugins_registry and the PodResources API on
// <root>/pod-resources/kubelet.sock), speaking the line protocol of
// hack/tools/cmd/kubelet-devicemanager, which runs the kubelet's own device
// manager. The differential tests (test/differential) drive both programs
// with one client and compare what they print; change the two protocols
// together.
//
//	dpkit-devicemanager --plugin-dir ROOT/device-plugins [--registry-dir ROOT/plugins_registry] [--pods FILE] [--poll 5ms] [-v N]
//
// Protocol: one JSON object per line on stdout, commands one per line on
// stdin, logs on stderr. Times are Unix nanoseconds.
//
//	{"event":"ready","socket":...,"processStart":NS,"serverStart":NS,"time":NS}
//	{"event":"capacity","capacity":{R:N},"allocatable":{R:N},"deleted":[R],"time":NS}
//	    printed whenever the capacity changes (polled every --poll)
//
//	allocate RESOURCE N [POD]  -> {"event":"allocation",...}: admit and start a one-container pod
//	admit POD-JSON             -> {"event":"admission","pod":..,"uid":..,"admitted":true,
//	                               "containers":[{"name":..,"deviceIDs":{R:[ids]}}]}
//	                              or {"event":"admission",...,"admitted":false,"reason":..,"error":..}
//	start POD CONTAINER        -> {"event":"start","pod":..,"container":..,"options":{...}|null}
//	                              or {"event":"start",...,"error":".."}
//	delete POD                 -> {"event":"deleted","pod":..}
//	capacity                   -> {"event":"capacity",...} now
//
// POD-JSON is {"name":..,"uid":..,"initContainers":[C..],"containers":[C..]}
// with C = {"name":..,"restartable":bool,"limits":{R:N}}. admit calls
// Manager.Admit, and on failure forgets the pod (RemovePod), as dpkit
// kubelet does; a known pod (same name and UID, from --pods) is admitted
// again. start calls PreStartContainer, then ContainerOptions. delete calls
// RemovePod. --pods names a JSON array of POD-JSON, the pods known at
// start: restored allocations of other pods are dropped at start
// (devicehost.Start), as dpkit kubelet does with the pods it persisted.
//
// SIGINT or SIGTERM stops the manager; SIGKILL stands for a crash.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/devicemanager"
)

func main() {
	processStart := time.Now()
	if err := run(processStart); err != nil {
		fmt.Fprintln(os.Stderr, "dpkit-devicemanager:", err)
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
	verbosity   int
}

func run(processStart time.Time) error {
	var o options
	fs := flag.CommandLine
	fs.StringVar(&o.pluginDir, "plugin-dir", "", "device plugin directory, <root>/device-plugins; the registration socket is <plugin-dir>/kubelet.sock")
	fs.StringVar(&o.registryDir, "registry-dir", "", "plugin watcher directory; it must be <root>/plugins_registry (devicehost's layout), which is watched whether given or not")
	fs.StringVar(&o.policy, "topology-policy", "", "topology policy: none, best-effort, restricted, single-numa-node")
	fs.StringVar(&o.scope, "topology-scope", "", "topology scope: container or pod")
	fs.StringVar(&o.numaNodes, "numa-nodes", "", "NUMA node IDs of the machine, e.g. 0,1")
	fs.StringVar(&o.pods, "pods", "", "JSON file listing the pods known at start")
	fs.DurationVar(&o.poll, "poll", 5*time.Millisecond, "how often the capacity is polled for changes")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity; 4 or more logs debug messages")
	flag.Parse()
	if flag.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if o.pluginDir == "" {
		return errors.New("--plugin-dir is required")
	}
	pluginDir, err := filepath.Abs(o.pluginDir)
	if err != nil {
		return err
	}
	root := filepath.Dir(pluginDir)
	if devicemanager.PluginDir(root) != pluginDir {
		return fmt.Errorf("--plugin-dir %s: must be <root>/device-plugins", pluginDir)
	}
	if o.registryDir != "" {
		if abs, err := filepath.Abs(o.registryDir); err != nil || abs != filepath.Join(root, "plugins_registry") {
			return fmt.Errorf("--registry-dir %s: must be %s", o.registryDir, filepath.Join(root, "plugins_registry"))
		}
	}
	var numa []int
	if o.numaNodes != "" {
		for _, s := range strings.Split(o.numaNodes, ",") {
			id, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return fmt.Errorf("--numa-nodes: %q is not a node ID: %w", s, err)
			}
			numa = append(numa, id)
		}
	}
	level := slog.LevelInfo
	if o.verbosity >= 4 {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	pods := &knownPods{byName: map[string]*corev1.Pod{}}
	if o.pods != "" {
		known, err := readPods(o.pods)
		if err != nil {
			return err
		}
		for _, p := range known {
			pods.byName[p.Name] = p
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	host, err := devicehost.New(devicehost.Config{
		Root: root, Logger: logger,
		TopologyPolicy: o.policy, TopologyScope: o.scope, NUMANodes: numa,
	})
	if err != nil {
		return err
	}
	serverStart := time.Now()
	hostCtx, cancelHost := context.WithCancel(ctx)
	if err := host.Start(hostCtx, pods.uids()); err != nil {
		cancelHost()
		return fmt.Errorf("start device manager: %w", err)
	}
	defer func() {
		cancelHost()
		host.Stop()
	}()

	out := &printer{enc: json.NewEncoder(os.Stdout)}
	out.print(map[string]any{
		"event": "ready", "socket": host.Manager.SocketPath(), "registryDir": filepath.Join(root, "plugins_registry"),
		"processStart": processStart.UnixNano(), "serverStart": serverStart.UnixNano(), "time": time.Now().UnixNano(),
	})

	a := &admitter{ctx: ctx, m: host.Manager, pods: pods, out: out}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()

	tick := time.NewTicker(o.poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			a.capacity(false)
		case line, ok := <-lines:
			if !ok {
				// stdin closed: keep serving until signalled.
				lines = nil
				continue
			}
			if strings.TrimSpace(line) == "capacity" {
				a.capacity(true)
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
		fmt.Fprintln(os.Stderr, "dpkit-devicemanager: write stdout:", err)
	}
}

// knownPods are the pods admitted (or known from --pods) and not deleted.
type knownPods struct {
	mu     sync.Mutex
	byName map[string]*corev1.Pod
}

func (k *knownPods) uids() []types.UID {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []types.UID
	for _, p := range k.byName {
		out = append(out, p.UID)
	}
	return out
}

func (k *knownPods) get(name string) *corev1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.byName[name]
}

func (k *knownPods) set(p *corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.byName[p.Name] = p
}

func (k *knownPods) remove(name string) *corev1.Pod {
	k.mu.Lock()
	defer k.mu.Unlock()
	p := k.byName[name]
	delete(k.byName, name)
	return p
}

type admitter struct {
	ctx  context.Context
	m    *devicemanager.Manager
	pods *knownPods
	out  *printer
	seq  int
	last string
	seen map[string]bool
}

func (a *admitter) capacity(always bool) {
	capacity, allocatable := a.m.Capacity()
	ev := map[string]any{"event": "capacity", "capacity": capacity, "allocatable": allocatable}
	key, _ := json.Marshal(ev)
	var deleted []string
	for name := range a.seen {
		if _, ok := capacity[name]; !ok {
			deleted = append(deleted, name)
		}
	}
	a.seen = make(map[string]bool, len(capacity))
	for name := range capacity {
		a.seen[name] = true
	}
	if len(deleted) > 0 {
		slices.Sort(deleted)
		ev["deleted"] = deleted
	}
	if string(key) == a.last && len(deleted) == 0 && !always {
		return
	}
	a.last = string(key)
	ev["time"] = time.Now().UnixNano()
	a.out.print(ev)
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
		p := a.pods.remove(f[1])
		if p == nil {
			a.out.print(map[string]any{"event": "error", "error": fmt.Sprintf("delete: no pod %q", f[1])})
			return
		}
		a.m.RemovePod(p.UID)
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

func (s podSpec) pod() *corev1.Pod {
	container := func(c containerSpec) corev1.Container {
		rl := corev1.ResourceList{}
		for r, n := range c.Limits {
			rl[corev1.ResourceName(r)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		out := corev1.Container{Name: c.Name, Resources: corev1.ResourceRequirements{Limits: rl, Requests: rl.DeepCopy()}}
		if c.Restartable {
			always := corev1.ContainerRestartPolicyAlways
			out.RestartPolicy = &always
		}
		return out
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: "default", UID: types.UID(s.UID)}}
	for _, c := range s.InitContainers {
		pod.Spec.InitContainers = append(pod.Spec.InitContainers, container(c))
	}
	for _, c := range s.Containers {
		pod.Spec.Containers = append(pod.Spec.Containers, container(c))
	}
	return pod
}

func readPods(path string) ([]*corev1.Pod, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--pods: %w", err)
	}
	var specs []podSpec
	if err := json.Unmarshal(data, &specs); err != nil {
		return nil, fmt.Errorf("--pods %s: %w", path, err)
	}
	pods := make([]*corev1.Pod, 0, len(specs))
	for _, s := range specs {
		if s.Name == "" || s.UID == "" {
			return nil, fmt.Errorf("--pods %s: every pod needs a name and a uid", path)
		}
		pods = append(pods, s.pod())
	}
	return pods, nil
}

// admitPod admits pod; a rejected pod is forgotten, as dpkit kubelet does.
func (a *admitter) admitPod(pod *corev1.Pod) (reason, message string, ok bool) {
	a.pods.set(pod)
	if _, err := a.m.Admit(a.ctx, pod); err != nil {
		a.pods.remove(pod.Name)
		a.m.RemovePod(pod.UID)
		var ae *devicemanager.AdmissionError
		if errors.As(err, &ae) {
			return ae.Reason, ae.PodMessage(), false
		}
		return devicemanager.ReasonUnexpectedAdmissionError, err.Error(), false
	}
	return "", "", true
}

func (a *admitter) allocate(name, res string, n int) {
	if a.pods.get(name) != nil {
		a.out.print(map[string]any{"event": "allocation", "pod": name, "error": fmt.Sprintf("pod %q exists; delete it first", name)})
		return
	}
	pod := podSpec{
		Name:       name,
		UID:        fmt.Sprintf("uid-%s-%d", name, time.Now().UnixNano()),
		Containers: []containerSpec{{Name: "main", Limits: map[string]int64{res: int64(n)}}},
	}.pod()
	ev := map[string]any{"event": "allocation", "pod": name, "uid": string(pod.UID), "container": "main"}
	if reason, msg, ok := a.admitPod(pod); !ok {
		ev["reason"], ev["error"] = reason, msg
		a.out.print(ev)
		return
	}
	if err := a.m.PreStartContainer(a.ctx, pod.UID, "main"); err != nil {
		ev["error"] = err.Error()
		a.out.print(ev)
		return
	}
	ev["deviceIDs"] = a.deviceIDs(pod.UID, "main")
	if opts := a.m.ContainerOptions(pod.UID, "main"); opts != nil {
		maps.Copy(ev, runOptions(opts))
	}
	a.out.print(ev)
}

func (a *admitter) admit(spec podSpec) {
	ev := map[string]any{"event": "admission", "pod": spec.Name, "uid": spec.UID}
	if spec.Name == "" || spec.UID == "" {
		ev["admitted"], ev["error"] = false, "admit: the pod needs a name and a uid"
		a.out.print(ev)
		return
	}
	if known := a.pods.get(spec.Name); known != nil && string(known.UID) != spec.UID {
		ev["admitted"], ev["error"] = false, fmt.Sprintf("pod %q exists with another uid; delete it first", spec.Name)
		a.out.print(ev)
		return
	}
	pod := spec.pod()
	if reason, msg, ok := a.admitPod(pod); !ok {
		ev["admitted"], ev["reason"], ev["error"] = false, reason, msg
		a.out.print(ev)
		return
	}
	var containers []map[string]any
	for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
		containers = append(containers, map[string]any{"name": c.Name, "deviceIDs": a.deviceIDs(pod.UID, c.Name)})
	}
	ev["admitted"], ev["containers"] = true, containers
	a.out.print(ev)
}

func (a *admitter) start(name, container string) {
	ev := map[string]any{"event": "start", "pod": name, "container": container}
	pod := a.pods.get(name)
	found := false
	if pod != nil {
		for _, c := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			found = found || c.Name == container
		}
	}
	if !found {
		ev["error"] = fmt.Sprintf("start: no pod %q with a container %q", name, container)
		a.out.print(ev)
		return
	}
	if err := a.m.PreStartContainer(a.ctx, pod.UID, container); err != nil {
		ev["error"] = err.Error()
		a.out.print(ev)
		return
	}
	if opts := a.m.ContainerOptions(pod.UID, container); opts != nil {
		ev["options"] = runOptions(opts)
	} else {
		ev["options"] = nil
	}
	a.out.print(ev)
}

func (a *admitter) deviceIDs(uid types.UID, container string) map[string][]string {
	ids := map[string][]string{}
	if pa := a.m.PodAllocation(uid); pa != nil {
		for _, c := range pa.Containers {
			if c.Name != container {
				continue
			}
			for _, r := range c.Resources {
				ids[r.Resource] = slices.Sorted(slices.Values(r.DeviceIDs))
			}
		}
	}
	return ids
}

// runOptions is the protocol's form of the container's runtime options,
// lists sorted like kubelet-devicemanager's.
func runOptions(opts *devicemanager.ContainerOptions) map[string]any {
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
		devices = append(devices, map[string]any{"containerPath": d.ContainerPath, "hostPath": d.HostPath, "permissions": d.Permissions})
	}
	byPath := func(x, y map[string]any) int {
		return strings.Compare(x["containerPath"].(string), y["containerPath"].(string))
	}
	slices.SortFunc(mounts, byPath)
	slices.SortFunc(devices, byPath)
	cdi := slices.Sorted(slices.Values(opts.CDIDevices))
	return map[string]any{"envs": envs, "annotations": ann, "mounts": mounts, "devices": devices, "cdiDevices": cdi}
}
