package e2e

// Interoperability with upstream Kubernetes code (v1.37.0), built by
// hack/build-upstream.sh (see docs/upstream-interop.md):
//
//   - dpkit plugin registers with the kubelet's own device manager
//     (kubelet-devicemanager), serves its allocations, and registers again
//     after each restart of it;
//   - the upstream sample device plugin registers with dpkit kubelet
//     unchanged, and its Allocate answer reaches the admitted pod.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/test/upstream"
)

const fooResource = "example.com/foo"

// TestUpstreamKubeletRegistersDpkitPlugin runs "dpkit plugin" with
// examples/fake.yaml against the kubelet's device manager, through both
// registration paths and the default choice between them: 8 devices in capacity and allocatable, an allocation
// of 2 answered with DPKIT_FAKE_DEVICES naming them, and the resource back
// with 8 devices after each of 5 restarts (SIGTERM and SIGKILL in turn).
// The time from the new kubelet's registration socket to the plugin's
// devices being counted is logged, not asserted.
func TestUpstreamKubeletRegistersDpkitPlugin(t *testing.T) {
	dm := upstream.DeviceManager(t)
	dpkit := dpkitBinary(t)
	config, err := filepath.Abs(filepath.Join("..", "..", "examples", "fake.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const restarts = 5
	for _, tc := range []struct {
		name         string
		registration string // dpkit plugin --registration
		registry     bool   // run the upstream plugin watcher
	}{
		{"kubelet.sock", "kubelet", false},
		{"plugins_registry", "registry", true},
		// The default: dpkit plugin picks plugins_registry because the
		// directory exists, as on a node whose kubelet watches it.
		{"auto", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			dir := testdir.Short(t, "dpup")
			pluginDir := filepath.Join(dir, "device-plugins")
			registryDir := filepath.Join(dir, "plugins_registry")
			args := []string{"--plugin-dir", pluginDir}
			if tc.registry {
				args = append(args, "--registry-dir", registryDir)
			}
			if err := os.MkdirAll(registryDir, 0o755); err != nil {
				t.Fatal(err)
			}

			k := startDeviceManager(t, ctx, dm, filepath.Join(dir, "kubelet-0.log"), args...)
			k.next(t, ctx, "ready", isEvent("ready"))
			pluginArgs := []string{"plugin", "--config", config, "--plugin-dir", pluginDir, "--registry-dir", registryDir}
			if tc.registration != "" {
				pluginArgs = append(pluginArgs, "--registration", tc.registration)
			}
			startProc(t, filepath.Join(dir, "plugin.log"), nil, dpkit, pluginArgs...)
			k.next(t, ctx, fooResource+" with 8 devices", hasDevices(fooResource, 8))
			// The path taken is the one meant: only a plugin registering
			// through the plugin watcher has its socket in plugins_registry.
			if got := socketsIn(t, registryDir); (len(got) > 0) != tc.registry {
				t.Errorf("sockets in plugins_registry: %v; want some: %v", got, tc.registry)
			}

			a := k.allocate(t, ctx, fooResource, 2, "two")
			checkFakeAllocation(t, a, 2)

			var fromSocket, fromStart []time.Duration
			for i := 1; i <= restarts; i++ {
				sig := syscall.SIGTERM
				if i%2 == 0 {
					sig = syscall.SIGKILL
				}
				k.stop(t, sig)
				k = startDeviceManager(t, ctx, dm, filepath.Join(dir, fmt.Sprintf("kubelet-%d.log", i)), args...)
				ready := k.next(t, ctx, "ready", isEvent("ready"))
				back := k.next(t, ctx, fmt.Sprintf("%s with 8 devices after restart %d (%s)", fooResource, i, sig), hasDevices(fooResource, 8))
				fromSocket = append(fromSocket, time.Duration(back.Time-ready.ServerStart))
				fromStart = append(fromStart, time.Duration(back.Time-ready.ProcessStart))
				t.Logf("restart %d (%s): %s back with 8 devices %v after the registration socket, %v after process start",
					i, sig, fooResource, fromSocket[i-1].Round(time.Microsecond), fromStart[i-1].Round(time.Microsecond))
			}
			t.Logf("re-registration over %d restarts (%s): from kubelet.sock min %v median %v max %v; from process start min %v median %v max %v",
				restarts, tc.name, minOf(fromSocket), medianOf(fromSocket), maxOf(fromSocket), minOf(fromStart), medianOf(fromStart), maxOf(fromStart))

			// The restarted kubelet knows no active pod, so the first
			// pod's devices are free again: all 8 can be allocated.
			a = k.allocate(t, ctx, fooResource, 8, "eight")
			checkFakeAllocation(t, a, 8)
			if a := k.allocate(t, ctx, fooResource, 1, "ninth"); a.Error == "" {
				t.Errorf("a ninth device was allocated (%v); want an error, all 8 are in use", a.DeviceIDs)
			}
		})
	}
}

// TestSamplePluginRegistersWithDpkitKubelet runs the upstream sample device
// plugin, unchanged, against "dpkit kubelet": "dpkit get resources -o json"
// shows example.com/resource with its two devices, and "dpkit admit" of a
// pod asking for one returns the plugin's Allocate answer (a mount of
// /tmp/<device>).
//
// The plugin registers through kubelet.sock only at the hard-coded
// /var/lib/kubelet/device-plugins/kubelet.sock, so two ways are checked:
// through plugins_registry (PLUGIN_SOCK_DIR, see upstream.SamplePluginEnv),
// which any user can run, and through kubelet.sock with the plugin's
// default configuration in a private mount namespace where dpkit kubelet's
// device-plugins directory is mounted at /var/lib/kubelet/device-plugins,
// which needs root (skipped, saying so, without it).
func TestSamplePluginRegistersWithDpkitKubelet(t *testing.T) {
	sample := upstream.SamplePlugin(t)
	dpkit := dpkitBinary(t)
	for _, tc := range []struct {
		name     string
		registry bool // registered through plugins_registry, else kubelet.sock
		start    func(t *testing.T, dir, root string)
	}{
		{"plugins_registry", true, func(t *testing.T, dir, root string) {
			startProc(t, filepath.Join(dir, "sample-device-plugin.log"),
				upstream.SamplePluginEnv(filepath.Join(root, "plugins_registry"), filepath.Join(dir, "hold-registration")), sample)
		}},
		{"kubelet.sock", false, func(t *testing.T, dir, root string) {
			unshare := privateMountNamespace(t)
			// Inside: a tmpfs on /var/lib hides the host's, then the
			// emulator's device-plugins directory is bound where the
			// plugin looks. The plugin runs with its defaults.
			script := `set -e; mount -t tmpfs dpkit-e2e /var/lib; mkdir -p /var/lib/kubelet/device-plugins; ` +
				`mount --bind "$1" /var/lib/kubelet/device-plugins; exec "$2"`
			var env []string
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, upstream.EnvSampleSockDir+"=") && !strings.HasPrefix(kv, upstream.EnvSampleRegisterControlFile+"=") {
					env = append(env, kv)
				}
			}
			startProc(t, filepath.Join(dir, "sample-device-plugin.log"), env,
				unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", filepath.Join(root, "device-plugins"), sample)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkSampleWithDpkitKubelet(t, dpkit, tc.registry, tc.start)
		})
	}
}

// privateMountNamespace returns the unshare command after checking that it
// can make a private mount namespace here; it skips t, saying why, when it
// cannot (not root, no unshare, or a container without CAP_SYS_ADMIN).
func privateMountNamespace(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount dpkit kubelet's device-plugins directory at /var/lib/kubelet/device-plugins in a private mount namespace; the plugins_registry case covers unprivileged runs")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skipf("needs unshare (util-linux) for a private mount namespace: %v", err)
	}
	if out, err := exec.Command(unshare, "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs dpkit-e2e /var/lib").CombinedOutput(); err != nil {
		t.Skipf("cannot make a private mount namespace here (%v): %s", err, out)
	}
	return unshare
}

func checkSampleWithDpkitKubelet(t *testing.T, dpkit string, registry bool, startPlugin func(t *testing.T, dir, root string)) {
	ctx := testContext(t)
	dir := testdir.Short(t, "dpup")
	root := filepath.Join(dir, "root")

	startProc(t, filepath.Join(dir, "kubelet.log"), nil, dpkit, "kubelet", "--root", root)
	getJSON := func(ctx context.Context, what string, into any) error {
		out, err := exec.CommandContext(ctx, dpkit, "get", what, "--root", root, "-o", "json").Output()
		if err != nil {
			return fmt.Errorf("dpkit get %s: %w", what, err)
		}
		return json.Unmarshal(out, into)
	}
	poll(t, ctx, "dpkit kubelet to answer", func(ctx context.Context) (bool, string, error) {
		var rs []emulator.Resource
		err := getJSON(ctx, "resources", &rs)
		return err == nil, fmt.Sprint(err), nil
	})

	startPlugin(t, dir, root)

	want := emulator.Resource{Name: upstream.SampleResource, Capacity: 2, Allocatable: 2, Connected: true}
	poll(t, ctx, "dpkit get resources to show "+upstream.SampleResource, func(ctx context.Context) (bool, string, error) {
		var rs []emulator.Resource
		if err := getJSON(ctx, "resources", &rs); err != nil {
			return false, "", err
		}
		return slices.Contains(rs, want), fmt.Sprintf("%+v", rs), nil
	})
	var devs []emulator.Device
	if err := getJSON(ctx, "devices", &devs); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range devs {
		if d.Resource == upstream.SampleResource && d.Healthy {
			ids = append(ids, d.ID)
		}
	}
	sort.Strings(ids)
	if !slices.Equal(ids, upstream.SampleDevices()) {
		t.Fatalf("healthy devices of %s: %v, want %v (all: %+v)", upstream.SampleResource, ids, upstream.SampleDevices(), devs)
	}
	// The registration path is the one meant: the plugin watcher lists
	// the plugin only when it came through plugins_registry.
	var plugins emulator.Plugins
	if err := getJSON(ctx, "plugins", &plugins); err != nil {
		t.Fatal(err)
	}
	if got := len(plugins.Registered); (got == 1) != registry {
		t.Errorf("plugin watcher lists %d plugins (%+v); want %d", got, plugins.Registered, map[bool]int{true: 1, false: 0}[registry])
	}

	admit := func(name string, wantCode int) (*emulator.Pod, string) {
		t.Helper()
		manifest := filepath.Join(dir, name+".yaml")
		writeFile(t, manifest, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: default
spec:
  containers:
  - name: main
    image: registry.k8s.io/pause:3.10
    resources:
      limits:
        %s: 1
`, name, upstream.SampleResource))
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, dpkit, "admit", "--root", root, "-f", manifest, "-o", "json")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != wantCode {
			t.Fatalf("dpkit admit %s: exit code %d, want %d\n%s%s", name, code, wantCode, stdout.String(), stderr.String())
		}
		if code != 0 {
			return nil, stderr.String()
		}
		var pod emulator.Pod
		if err := json.Unmarshal(stdout.Bytes(), &pod); err != nil {
			t.Fatalf("dpkit admit -o json: %v\n%s", err, stdout.String())
		}
		return &pod, ""
	}
	seen := map[string]bool{}
	for _, name := range []string{"sample-a", "sample-b"} {
		pod, _ := admit(name, 0)
		id := checkSampleAllocation(t, pod)
		if seen[id] {
			t.Errorf("pod %s got device %s, already given to another pod", name, id)
		}
		seen[id] = true
	}
	if _, msg := admit("sample-c", 1); !strings.Contains(msg, "UnexpectedAdmissionError") {
		t.Errorf("a third pod was rejected with %q, want UnexpectedAdmissionError (both devices in use)", msg)
	}
}

// TestSamplePluginRegistersWithUpstreamKubelet is the control for
// TestSamplePluginRegistersWithDpkitKubelet: the same sample plugin,
// started the same way, against the kubelet's own device manager and
// plugin watcher, registers and answers Allocate the same way.
func TestSamplePluginRegistersWithUpstreamKubelet(t *testing.T) {
	sample := upstream.SamplePlugin(t)
	dm := upstream.DeviceManager(t)
	ctx := testContext(t)
	dir := testdir.Short(t, "dpup")
	registryDir := filepath.Join(dir, "plugins_registry")
	k := startDeviceManager(t, ctx, dm, filepath.Join(dir, "kubelet.log"),
		"--plugin-dir", filepath.Join(dir, "device-plugins"), "--registry-dir", registryDir)
	k.next(t, ctx, "ready", isEvent("ready"))
	startProc(t, filepath.Join(dir, "sample-device-plugin.log"),
		upstream.SamplePluginEnv(registryDir, filepath.Join(dir, "hold-registration")), sample)
	k.next(t, ctx, upstream.SampleResource+" with 2 devices", hasDevices(upstream.SampleResource, 2))
	a := k.allocate(t, ctx, upstream.SampleResource, 1, "sample")
	ids := a.DeviceIDs[upstream.SampleResource]
	if a.Error != "" || len(ids) != 1 || !slices.Contains(upstream.SampleDevices(), ids[0]) {
		t.Fatalf("allocation: %+v; want one of %v", a, upstream.SampleDevices())
	}
	if !slices.ContainsFunc(a.Mounts, func(m dmMount) bool { return m.HostPath == upstream.SampleMount(ids[0]) }) {
		t.Errorf("mounts %+v, want host path %s", a.Mounts, upstream.SampleMount(ids[0]))
	}
}

// checkSampleAllocation checks that pod's one container got one sample
// device and the sample plugin's mount for it, and returns the device.
func checkSampleAllocation(t *testing.T, pod *emulator.Pod) string {
	t.Helper()
	if len(pod.Containers) != 1 || len(pod.Containers[0].Devices) != 1 {
		t.Fatalf("admitted pod %+v: want one container with one resource", pod)
	}
	c := pod.Containers[0]
	d := c.Devices[0]
	if d.Resource != upstream.SampleResource || len(d.DeviceIDs) != 1 || !slices.Contains(upstream.SampleDevices(), d.DeviceIDs[0]) {
		t.Fatalf("pod %s devices %+v, want one of %v of %s", pod.Name, c.Devices, upstream.SampleDevices(), upstream.SampleResource)
	}
	id := d.DeviceIDs[0]
	if c.Options == nil || !slices.ContainsFunc(c.Options.Mounts, func(m emulator.Mount) bool {
		return m.HostPath == upstream.SampleMount(id) && m.ContainerPath == upstream.SampleMount(id)
	}) {
		t.Fatalf("pod %s runtime options %+v, want the sample plugin's Allocate answer: a mount of %s", pod.Name, c.Options, upstream.SampleMount(id))
	}
	return id
}

// checkFakeAllocation checks an allocation of n devices of example.com/foo
// by the fake plugin: DPKIT_FAKE_DEVICES names exactly the devices the
// kubelet allocated.
func checkFakeAllocation(t *testing.T, a dmEvent, n int) {
	t.Helper()
	if a.Error != "" {
		t.Fatalf("allocate %d %s: %s: %s", n, fooResource, a.Reason, a.Error)
	}
	ids := slices.Clone(a.DeviceIDs[fooResource])
	if len(ids) != n {
		t.Fatalf("allocated %v, want %d devices of %s", a.DeviceIDs, n, fooResource)
	}
	env, ok := a.Envs["DPKIT_FAKE_DEVICES"]
	if !ok {
		t.Fatalf("Allocate answer has no DPKIT_FAKE_DEVICES; envs %v", a.Envs)
	}
	got := strings.Split(env, ",")
	sort.Strings(got)
	sort.Strings(ids)
	if !slices.Equal(got, ids) {
		t.Errorf("DPKIT_FAKE_DEVICES=%s, want the allocated devices %v", env, ids)
	}
}

// socketsIn lists the unix sockets in dir.
func socketsIn(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			out = append(out, e.Name())
		}
	}
	return out
}

// proc is a process a test started, with its output in a log file shown
// when the test fails.
type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProc starts path with args, output to logPath, and stops it with
// SIGTERM (SIGKILL after 10 s) when the test ends. env nil means the
// test's environment.
func startProc(t *testing.T, logPath string, env []string, path string, args ...string) *proc {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := upstream.Command(path, args...)
	cmd.Env = env
	cmd.Dir = filepath.Dir(logPath)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		t.Fatalf("start %s: %v", path, err)
	}
	p := &proc{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t, syscall.SIGTERM)
		if t.Failed() {
			logTail(t, logPath)
		}
	})
	return p
}

// stop signals the process and waits for it; a process still running 10 s
// after a signal other than SIGKILL is killed.
func (p *proc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not exit 10 s after %s; killing it", filepath.Base(p.cmd.Path), sig)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func logTail(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("%s: %v", path, err)
		return
	}
	const max = 8 << 10
	if len(data) > max {
		data = data[len(data)-max:]
	}
	t.Logf("%s (tail):\n%s", filepath.Base(path), data)
}

// dmEvent is one line kubelet-devicemanager prints on its standard output.
type dmEvent struct {
	Event        string              `json:"event"`
	Time         int64               `json:"time"`
	ProcessStart int64               `json:"processStart"`
	ServerStart  int64               `json:"serverStart"`
	Socket       string              `json:"socket"`
	Capacity     map[string]int64    `json:"capacity"`
	Allocatable  map[string]int64    `json:"allocatable"`
	Pod          string              `json:"pod"`
	DeviceIDs    map[string][]string `json:"deviceIDs"`
	Envs         map[string]string   `json:"envs"`
	Mounts       []dmMount           `json:"mounts"`
	Reason       string              `json:"reason"`
	Error        string              `json:"error"`
}

type dmMount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
}

func isEvent(name string) func(dmEvent) bool {
	return func(e dmEvent) bool { return e.Event == name }
}

// hasDevices matches a capacity event with n devices of resource in both
// capacity and allocatable.
func hasDevices(resource string, n int64) func(dmEvent) bool {
	return func(e dmEvent) bool {
		return e.Event == "capacity" && e.Capacity[resource] == n && e.Allocatable[resource] == n
	}
}

// deviceManager is a running kubelet-devicemanager.
type deviceManager struct {
	*proc
	stdin  io.WriteCloser
	events chan dmEvent
	mu     sync.Mutex
	seen   []string // every line, for failure messages
}

func startDeviceManager(t *testing.T, ctx context.Context, bin, logPath string, args ...string) *deviceManager {
	t.Helper()
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := upstream.Command(bin, append([]string{"-v", "2"}, args...)...)
	cmd.Stderr = f
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	d := &deviceManager{proc: &proc{cmd: cmd, log: logPath, done: make(chan struct{})}, stdin: stdin, events: make(chan dmEvent, 256)}
	go func() {
		defer close(d.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.seen = append(d.seen, sc.Text())
			d.mu.Unlock()
			var e dmEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = dmEvent{Event: "unparsed", Error: err.Error()}
			}
			select {
			case d.events <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	go func() {
		d.err = cmd.Wait()
		_ = f.Close()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		d.stop(t, syscall.SIGTERM)
		if t.Failed() {
			logTail(t, logPath)
		}
	})
	return d
}

// next returns the first event from now on that match accepts.
func (d *deviceManager) next(t *testing.T, ctx context.Context, what string, match func(dmEvent) bool) dmEvent {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		select {
		case e, ok := <-d.events:
			if !ok {
				<-d.done
				t.Fatalf("kubelet-devicemanager exited (%v) before %s; it printed:\n%s", d.err, what, d.lines())
			}
			if match(e) {
				return e
			}
		case <-deadline.C:
			t.Fatalf("kubelet-devicemanager: no %s in %v; it printed:\n%s", what, waitTimeout, d.lines())
		case <-ctx.Done():
			t.Fatalf("kubelet-devicemanager: no %s: %v; it printed:\n%s", what, ctx.Err(), d.lines())
		}
	}
}

func (d *deviceManager) lines() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return strings.Join(d.seen, "\n")
}

// allocate admits a pod asking for n of resource through the kubelet's
// admit handler and returns the allocation event.
func (d *deviceManager) allocate(t *testing.T, ctx context.Context, resource string, n int, pod string) dmEvent {
	t.Helper()
	if _, err := fmt.Fprintf(d.stdin, "allocate %s %d %s\n", resource, n, pod); err != nil {
		t.Fatalf("write to kubelet-devicemanager: %v", err)
	}
	return d.next(t, ctx, "allocation of pod "+pod, func(e dmEvent) bool {
		return (e.Event == "allocation" && e.Pod == pod) || e.Event == "error"
	})
}

func minOf(ds []time.Duration) time.Duration { return slices.Min(ds).Round(time.Microsecond) }
func maxOf(ds []time.Duration) time.Duration { return slices.Max(ds).Round(time.Microsecond) }
func medianOf(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Microsecond)
}

// TestUpstreamKubeletSocketDeletedThenPluginStops: "dpkit plugin" with
// examples/fake.yaml registered with the kubelet's own device manager
// through kubelet.sock; its socket is deleted while both run. The plugin
// serves a fresh socket, the kubelet accepts its registration (it refuses
// the old path while it still holds a connection to it), the plugin ends
// the old connection and keeps serving allocations. Then the plugin stops,
// and the kubelet's allocatable for example.com/foo falls to 0: no stale
// endpoint keeps dead devices advertised. The time it takes is logged.
func TestUpstreamKubeletSocketDeletedThenPluginStops(t *testing.T) {
	dm := upstream.DeviceManager(t)
	dpkit := dpkitBinary(t)
	config, err := filepath.Abs(filepath.Join("..", "..", "examples", "fake.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	dir := testdir.Short(t, "dpup")
	pluginDir := filepath.Join(dir, "device-plugins")
	k := startDeviceManager(t, ctx, dm, filepath.Join(dir, "kubelet.log"), "--plugin-dir", pluginDir)
	k.next(t, ctx, "ready", isEvent("ready"))
	pluginLog := filepath.Join(dir, "plugin.log")
	p := startProc(t, pluginLog, nil, dpkit, "plugin", "--config", config, "--plugin-dir", pluginDir, "--registration", "kubelet")
	k.next(t, ctx, fooResource+" with 8 devices", hasDevices(fooResource, 8))
	waitForLog(t, ctx, pluginLog, "Registered with the kubelet", 1)
	checkFakeAllocation(t, k.allocate(t, ctx, fooResource, 2, "before"), 2)

	socks := socketsIn(t, pluginDir)
	var first string
	for _, s := range socks {
		if strings.HasPrefix(s, "example_com_foo-") {
			first = s
		}
	}
	if first == "" {
		t.Fatalf("no socket of the plugin in %s: %v", pluginDir, socks)
	}
	if err := os.Remove(filepath.Join(pluginDir, first)); err != nil {
		t.Fatal(err)
	}
	waitForLog(t, ctx, pluginLog, "Registered with the kubelet", 2)
	if slices.Contains(socketsIn(t, pluginDir), first) {
		t.Errorf("the deleted socket %s was served again; want a fresh path", first)
	}
	checkFakeAllocation(t, k.allocate(t, ctx, fooResource, 2, "after"), 2)

	stopped := time.Now()
	p.stop(t, syscall.SIGTERM)
	e := k.next(t, ctx, "allocatable "+fooResource+" 0 after the plugin stopped", func(e dmEvent) bool {
		return e.Event == "capacity" && e.Allocatable[fooResource] == 0
	})
	took := time.Unix(0, e.Time).Sub(stopped)
	t.Logf("allocatable fell to 0 %v after the plugin was stopped", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Errorf("allocatable fell to 0 only %v after the plugin stopped; want within 10 s", took)
	}
}

// waitForLog waits until the file at path holds substr at least n times,
// re-reading it whenever it is written.
func waitForLog(t *testing.T, ctx context.Context, path, substr string, n int) {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(path); err != nil {
		t.Fatal(err)
	}
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(string(data), substr) >= n {
			return
		}
		select {
		case <-w.Events:
		case err := <-w.Errors:
			t.Fatalf("watch %s: %v", path, err)
		case <-deadline.C:
			t.Fatalf("%q not %d times in %s after %v:\n%s", substr, n, filepath.Base(path), waitTimeout, data)
		case <-ctx.Done():
			t.Fatalf("%q not %d times in %s: %v", substr, n, filepath.Base(path), ctx.Err())
		}
	}
}
