package cri

import (
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// recorder keeps every state the backend notifies and wakes waiters.
type recorder struct {
	mu     sync.Mutex
	seen   map[types.UID][]*corev1.Pod
	change chan struct{}
}

func newRecorder() *recorder {
	return &recorder{seen: map[types.UID][]*corev1.Pod{}, change: make(chan struct{})}
}

func (r *recorder) notify(p *corev1.Pod) {
	r.mu.Lock()
	r.seen[p.UID] = append(r.seen[p.UID], p)
	close(r.change)
	r.change = make(chan struct{})
	r.mu.Unlock()
}

// wait returns the first notified state of uid that satisfies cond.
func (r *recorder) wait(t *testing.T, uid types.UID, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	next := 0
	for {
		r.mu.Lock()
		seen, ch := r.seen[uid], r.change
		r.mu.Unlock()
		var p *corev1.Pod
		for ; next < len(seen); next++ {
			if p = seen[next]; cond(p) {
				return p
			}
		}
		select {
		case <-ch:
		case <-timeout.C:
			t.Fatalf("pod never %s; last %+v", what, p)
		}
	}
}

func waitingReason(p *corev1.Pod, reason string) bool {
	cs := p.Status.ContainerStatuses
	return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == reason
}

func newTestBackend(t *testing.T, f *fakeRuntime, rec *recorder, cfg backend.Config, backoff time.Duration) *Backend {
	t.Helper()
	cfg.Notify = rec.notify
	b, err := New(context.Background(), Config{
		Config: cfg, Endpoint: "unix://" + f.socket, Node: "vn1", LogDir: t.TempDir(),
		PollInterval: 5 * time.Millisecond, BackoffInitial: backoff,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testPod(name string, policy corev1.RestartPolicy, c corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{RestartPolicy: policy, Containers: []corev1.Container{c}, TerminationGracePeriodSeconds: ptrTo(int64(7))},
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestDevicesEnvAndDeletion: the container gets the node's environment
// without DPKIT_CDI_DEVICES, the device plugins' device nodes, mounts and
// annotations and the CDI devices, its command expanded; its log is read
// from where the runtime writes it; deletion stops it with the grace
// period and leaves no sandbox or container.
func TestDevicesEnvAndDeletion(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{
		ContainerEnv: func(context.Context, *corev1.Pod, string) ([]corev1.EnvVar, error) {
			return []corev1.EnvVar{{Name: "FROM_PLUGIN", Value: "dev-1"}, {Name: cdiEnv, Value: "vendor.com/claim=x"}}, nil
		},
		ContainerDevices: func(context.Context, *corev1.Pod, string) (*backend.ContainerDevices, error) {
			return &backend.ContainerDevices{
				Devices:     []backend.DeviceSpec{{HostPath: "/dev/zero", ContainerPath: "/dev/dpkit-zero", Permissions: "rw"}},
				Mounts:      []backend.Mount{{HostPath: "/opt/lib", ContainerPath: "/usr/lib/dev", ReadOnly: true}},
				Annotations: map[string]string{"a": "b"},
				CDIDevices:  []string{"vendor.com/dev=1", "vendor.com/claim=x"},
			}, nil
		},
	}, time.Hour)
	defer b.Close()
	pod := testPod("app", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullNever,
		Command: []string{"sh", "-c"}, Args: []string{"echo $(GREETING)"},
		Env: []corev1.EnvVar{{Name: "GREETING", Value: "hi"}},
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	got := rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if cs := got.Status.ContainerStatuses[0]; !strings.HasPrefix(cs.ContainerID, "fake://c") || cs.ImageID == "" || got.Status.PodIP != "10.9.9.9" {
		t.Errorf("status %+v, want a fake:// container ID, an image ID and the sandbox's IP", got.Status)
	}
	cfg := f.running("app")
	if cfg == nil {
		t.Fatal("no running container")
	}
	var env []string
	for _, kv := range cfg.Envs {
		env = append(env, kv.Key+"="+string(kv.Value))
	}
	if !slices.Equal(env, []string{"GREETING=hi", "FROM_PLUGIN=dev-1"}) {
		t.Errorf("env %v, want GREETING and FROM_PLUGIN only", env)
	}
	if len(cfg.Devices) != 1 || cfg.Devices[0].HostPath != "/dev/zero" || cfg.Devices[0].ContainerPath != "/dev/dpkit-zero" || cfg.Devices[0].Permissions != "rw" {
		t.Errorf("devices %v", cfg.Devices)
	}
	// The device plugins' mounts first, then the pod's managed /etc/hosts.
	if len(cfg.Mounts) != 2 || cfg.Mounts[0].ContainerPath != "/usr/lib/dev" || !cfg.Mounts[0].Readonly || cfg.Mounts[1].ContainerPath != "/etc/hosts" {
		t.Errorf("mounts %v, want /usr/lib/dev read-only then /etc/hosts", cfg.Mounts)
	}
	var cdi []string
	for _, d := range cfg.CDIDevices {
		cdi = append(cdi, d.Name)
	}
	if !slices.Equal(cdi, []string{"vendor.com/dev=1", "vendor.com/claim=x"}) || cfg.Annotations["a"] != "b" {
		t.Errorf("CDI devices %v annotations %v", cdi, cfg.Annotations)
	}
	if !slices.Equal(cfg.Args, []string{"echo hi"}) || cfg.LogPath != "app/0.log" || cfg.Labels[LabelPodUID] != string(pod.UID) {
		t.Errorf("args %v log path %q labels %v", cfg.Args, cfg.LogPath, cfg.Labels)
	}

	rc, err := b.Logs(context.Background(), "ns", "app", "app", backend.LogOptions{Tail: -1})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(rc)
	rc.Close()
	if string(out) != "started app attempt 0\n" {
		t.Errorf("logs %q", out)
	}

	if err := b.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	end := rec.wait(t, pod.UID, "terminal", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if term := end.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 143 {
		t.Errorf("container state %+v, want terminated with 143", end.Status.ContainerStatuses[0].State)
	}
	if sb, cs := f.counts(); sb != 0 || cs != 0 {
		t.Errorf("runtime keeps %d sandboxes and %d containers after deletion, want none", sb, cs)
	}
	f.mu.Lock()
	stops := slices.Clone(f.stops)
	f.mu.Unlock()
	if !slices.Equal(stops, []int64{7}) {
		t.Errorf("StopContainer timeouts %v, want the grace period [7]", stops)
	}
}

// TestRestartBackoff: a container that fails waits in CrashLoopBackOff
// with its last termination, and restarts as attempt 1 once the back-off
// passed, the dead one kept for its previous logs.
func TestRestartBackoff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		backoff time.Duration
	}{{"waiting", time.Hour}, {"restarted", time.Nanosecond}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeRuntime(t)
			rec := newRecorder()
			b := newTestBackend(t, f, rec, backend.Config{}, tc.backoff)
			defer b.Close()
			pod := testPod("crash", corev1.RestartPolicyOnFailure, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent})
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
			f.exit(t, "app", 3)
			if tc.backoff == time.Hour {
				p := rec.wait(t, pod.UID, "in CrashLoopBackOff", func(p *corev1.Pod) bool { return waitingReason(p, "CrashLoopBackOff") })
				if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 3 || lt.Reason != "Error" {
					t.Errorf("last termination %+v, want exit 3 (Error)", p.Status.ContainerStatuses[0].LastTerminationState)
				}
				if p.Status.Phase != corev1.PodRunning {
					t.Errorf("phase %s in CrashLoopBackOff, want Running", p.Status.Phase)
				}
				return
			}
			p := rec.wait(t, pod.UID, "restarted", func(p *corev1.Pod) bool {
				cs := p.Status.ContainerStatuses[0]
				return cs.RestartCount == 1 && cs.State.Running != nil
			})
			if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil || lt.ExitCode != 3 {
				t.Errorf("last termination %+v, want exit 3", p.Status.ContainerStatuses[0].LastTerminationState)
			}
			if cfg := f.running("app"); cfg == nil || cfg.Metadata.Attempt != 1 || cfg.LogPath != "app/1.log" {
				t.Errorf("running container %v, want attempt 1 logging to app/1.log", cfg)
			}
			if _, cs := f.counts(); cs != 2 {
				t.Errorf("%d containers, want the running one and the dead one", cs)
			}
			rc, err := b.Logs(context.Background(), "ns", "crash", "app", backend.LogOptions{Tail: -1, Previous: true})
			if err != nil {
				t.Fatal(err)
			}
			out, _ := io.ReadAll(rc)
			rc.Close()
			if string(out) != "started app attempt 0\n" {
				t.Errorf("previous logs %q", out)
			}
		})
	}
}

// TestImages: a missing image with pull policy Never, and one whose pull
// fails, wait with the kubelet's reasons; no container is created.
func TestImages(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
	defer b.Close()
	never := testPod("never", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "absent:1", ImagePullPolicy: corev1.PullNever})
	pull := testPod("pull", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "absent:1"})
	untagged := testPod("untagged", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "registry.test:5000/absent", ImagePullPolicy: corev1.PullAlways})
	for _, p := range []*corev1.Pod{never, pull, untagged} {
		if err := b.CreatePod(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	p := rec.wait(t, never.UID, "ErrImageNeverPull", func(p *corev1.Pod) bool { return waitingReason(p, "ErrImageNeverPull") })
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; msg != `Container image "absent:1" is not present with pull policy of Never` {
		t.Errorf("message %q", msg)
	}
	rec.wait(t, pull.UID, "ErrImagePull", func(p *corev1.Pod) bool { return waitingReason(p, "ErrImagePull") })
	p = rec.wait(t, pull.UID, "ImagePullBackOff", func(p *corev1.Pod) bool { return waitingReason(p, "ImagePullBackOff") })
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.HasPrefix(msg, `Back-off pulling image "absent:1"`) {
		t.Errorf("message %q", msg)
	}
	// The runtime is asked for the image with the default tag, as by the
	// kubelet; messages name it as the pod does.
	p = rec.wait(t, untagged.UID, "ErrImagePull", func(p *corev1.Pod) bool { return waitingReason(p, "ErrImagePull") })
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, `"registry.test:5000/absent:latest"`) {
		t.Errorf("message %q, want the runtime's error for registry.test:5000/absent:latest", msg)
	}
	f.mu.Lock()
	pulls := slices.Clone(f.pulls)
	f.mu.Unlock()
	if !slices.Contains(pulls, "registry.test:5000/absent:latest") || slices.Contains(pulls, "registry.test:5000/absent") {
		t.Errorf("pulls %q, want registry.test:5000/absent:latest", pulls)
	}
	if _, cs := f.counts(); cs != 0 {
		t.Errorf("%d containers created without an image", cs)
	}
}

// TestWithDefaultTag: the tag "latest" is added where the kubelet adds it.
func TestWithDefaultTag(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"foo":                                   "foo:latest",
		"foo:1":                                 "foo:1",
		"library/foo":                           "library/foo:latest",
		"registry.test:5000/foo":                "registry.test:5000/foo:latest",
		"registry.test:5000/foo:1":              "registry.test:5000/foo:1",
		"foo@sha256:" + strings.Repeat("a", 64): "foo@sha256:" + strings.Repeat("a", 64),
	} {
		if got := withDefaultTag(in); got != want {
			t.Errorf("withDefaultTag(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestAdopt: a new backend on the same runtime adopts the running pod
// with its container and follows it to its end.
func TestAdopt(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
	pod := testPod("kept", corev1.RestartPolicyNever, corev1.Container{Name: "app", Image: "busybox:1"})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	before := rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	rec2 := newRecorder()
	b2 := newTestBackend(t, f, rec2, backend.Config{}, time.Hour)
	defer b2.Close()
	pods := b2.Pods()
	if len(pods) != 1 || pods[0].UID != pod.UID || pods[0].Status.ContainerStatuses[0].ContainerID != before.Status.ContainerStatuses[0].ContainerID {
		t.Fatalf("adopted %+v, want the pod with container %s", pods, before.Status.ContainerStatuses[0].ContainerID)
	}
	f.exit(t, "app", 0)
	end := rec2.wait(t, pod.UID, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if term := end.Status.ContainerStatuses[0].State.Terminated; term == nil || term.Reason != "Completed" {
		t.Errorf("state %+v, want Completed", end.Status.ContainerStatuses[0].State)
	}
	if sb, cs := f.counts(); sb != 1 || cs != 1 {
		t.Errorf("%d sandboxes %d containers: a new backend must not create the pod again", sb, cs)
	}
}

// TestBadEndpoint: an endpoint that is not a unix socket, or where no
// socket is, is refused at once with the fix.
func TestBadEndpoint(t *testing.T) {
	t.Parallel()
	for endpoint, want := range map[string]string{
		"tcp://1.2.3.4:5": "only unix:// sockets are supported",
		"unix://" + t.TempDir() + "/containerd.sock": "no such file or directory (is containerd or CRI-O running, and is this its CRI socket?)",
	} {
		_, err := New(context.Background(), Config{Endpoint: endpoint, Node: "n", LogDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", endpoint, err, want)
		}
	}
}

// TestInitContainers: the app container is created only once the init
// container exited 0, and the pod is Initialized then.
func TestInitContainers(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
	defer b.Close()
	pod := testPod("init", corev1.RestartPolicyNever, corev1.Container{Name: "app", Image: "busybox:1"})
	pod.Spec.InitContainers = []corev1.Container{{Name: "setup", Image: "busybox:1"}}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "running its init container", func(p *corev1.Pod) bool {
		cs := p.Status.InitContainerStatuses
		return len(cs) == 1 && cs[0].State.Running != nil
	})
	if f.running("app") != nil {
		t.Fatal("the app container runs before the init container ended")
	}
	f.exit(t, "setup", 0)
	p := rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if term := p.Status.InitContainerStatuses[0].State.Terminated; term == nil || term.Reason != "Completed" {
		t.Errorf("init container %+v, want Completed", p.Status.InitContainerStatuses[0].State)
	}
	if f.running("app") == nil {
		t.Error("the app container does not run after the init container")
	}
}

// TestSandboxBackoff: a sandbox the runtime fails to create is reported
// as the kubelet does (a FailedCreatePodSandBox event, the pod Pending,
// its container waiting in ContainerCreating with the error) and tried
// again no sooner than the back-off, until it is created.
func TestSandboxBackoff(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	f.sandboxFailures = 2
	rec := newRecorder()
	var mu sync.Mutex
	var events []string
	const backoff = 300 * time.Millisecond
	b := newTestBackend(t, f, rec, backend.Config{Event: func(pod *corev1.Pod, _, eventType, reason, message string) {
		if reason == "MissingClusterDNS" { // each attempt, as the kubelet's GetPodDNS
			return
		}
		mu.Lock()
		events = append(events, eventType+" "+reason+" "+message)
		mu.Unlock()
	}}, backoff)
	defer b.Close()
	pod := testPod("nonet", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	p := rec.wait(t, pod.UID, "waiting with the sandbox's error", func(p *corev1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == "ContainerCreating" && w.Message != ""
	})
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
	t.Logf("waiting: %s", p.Status.ContainerStatuses[0].State.Waiting.Message)
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	f.mu.Lock()
	calls := append([]time.Time(nil), f.sandboxCalls...)
	f.mu.Unlock()
	if len(calls) != 3 {
		t.Fatalf("RunPodSandbox called %d times, want 3 (two failures, then created)", len(calls))
	}
	for i := 1; i < len(calls); i++ {
		if gap := calls[i].Sub(calls[i-1]); gap < backoff {
			t.Errorf("attempt %d came %v after the failed one, want at least the back-off %v", i+1, gap, backoff)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := `Warning FailedCreatePodSandBox Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox: plugin type="ptp" failed`
	if len(events) != 2 || events[0] != want || events[1] != want {
		t.Errorf("events %q, want twice %q", events, want)
	}
}
