package cri

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// eventLog keeps the events the backend records, as
// "<container> <type> <reason>: <message>".
type eventLog struct {
	mu     sync.Mutex
	list   []string
	change chan struct{}
}

func newEventLog() *eventLog { return &eventLog{change: make(chan struct{})} }

func (e *eventLog) record(_ *corev1.Pod, container, eventType, reason, message string) {
	e.mu.Lock()
	e.list = append(e.list, fmt.Sprintf("%s %s %s: %s", container, eventType, reason, message))
	close(e.change)
	e.change = make(chan struct{})
	e.mu.Unlock()
}

func (e *eventLog) has(want string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Contains(e.list, want)
}

func (e *eventLog) wait(t *testing.T, want string) {
	t.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		e.mu.Lock()
		ok, ch, list := slices.Contains(e.list, want), e.change, slices.Clone(e.list)
		e.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-timeout.C:
			t.Fatalf("no event %q; events %q", want, list)
		}
	}
}

// ticks paces the probe workers: a tick is handed to a worker only when
// it waits for one, so the probe a tick starts has ended by the time the
// next tick is taken.
type ticks struct {
	mu sync.Mutex
	ch map[string]chan time.Time
}

func (tk *ticks) get(name string) chan time.Time {
	tk.mu.Lock()
	defer tk.mu.Unlock()
	if tk.ch == nil {
		tk.ch = map[string]chan time.Time{}
	}
	if tk.ch[name] == nil {
		tk.ch[name] = make(chan time.Time)
	}
	return tk.ch[name]
}

func (tk *ticks) ticker(name string, _ time.Duration) (<-chan time.Time, func()) {
	return tk.get(name), func() {}
}

// tick hands one tick to the worker of name ("<container>/<Kind>").
func (tk *ticks) tick(t *testing.T, name string) {
	t.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	select {
	case tk.get(name) <- time.Now():
	case <-timeout.C:
		t.Fatalf("the %s probe worker never waited for a tick", name)
	}
}

func newProbeBackend(t *testing.T, f *fakeRuntime, rec *recorder, ev *eventLog, tk *ticks, backoff time.Duration) *Backend {
	t.Helper()
	b, err := New(context.Background(), Config{
		Config:   backend.Config{Notify: rec.notify, Event: ev.record},
		Endpoint: "unix://" + f.socket, Node: "vn1", LogDir: t.TempDir(),
		PollInterval: 5 * time.Millisecond, BackoffInitial: backoff, probeTicker: tk.ticker,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func (f *fakeRuntime) setExec(fn func(container string, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error)) {
	f.mu.Lock()
	f.exec = fn
	f.mu.Unlock()
}

func execProbe(cmd ...string) corev1.ProbeHandler {
	return corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: cmd}}
}

func appStatus(p *corev1.Pod) corev1.ContainerStatus {
	if len(p.Status.ContainerStatuses) == 0 {
		return corev1.ContainerStatus{}
	}
	return p.Status.ContainerStatuses[0]
}

func started(cs corev1.ContainerStatus) bool { return cs.Started != nil && *cs.Started }

func podCondition(p *corev1.Pod, ct corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == ct {
			return c.Status
		}
	}
	return ""
}

// TestReadinessProbe: an exec readiness probe (its command expanded with
// the container's literal variables, run with its timeout) keeps the
// container and the pod not ready, with Unhealthy events, until it
// passes; failureThreshold failures in a row make it not ready again.
func TestReadinessProbe(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
	// Every probe waits for the test's answer.
	answers := make(chan bool)
	var mu sync.Mutex
	var timeouts []int64
	f.setExec(func(_ string, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
		mu.Lock()
		timeouts = append(timeouts, r.Timeout)
		mu.Unlock()
		if <-answers {
			return &runtimeapi.ExecSyncResponse{Stdout: []byte("ok")}, nil
		}
		return &runtimeapi.ExecSyncResponse{ExitCode: 1, Stderr: []byte("cat: /tmp/ready: No such file")}, nil
	})
	// answer answers the probe that waits, or has the worker probe.
	answer := func(ok bool) {
		t.Helper()
		timeout := time.NewTimer(30 * time.Second)
		defer timeout.Stop()
		select {
		case answers <- ok:
		case tk.get("app/Readiness") <- time.Now():
			select {
			case answers <- ok:
			case <-timeout.C:
				t.Fatal("the readiness probe never ran")
			}
		case <-timeout.C:
			t.Fatal("the readiness probe never ran")
		}
	}
	b := newProbeBackend(t, f, rec, ev, tk, time.Hour)
	pod := testPod("ready", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", Env: []corev1.EnvVar{{Name: "FILE", Value: "/tmp/ready"}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: execProbe("cat", "$(FILE)"), TimeoutSeconds: 4, FailureThreshold: 2},
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	p := rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if cs := appStatus(p); cs.Ready || !started(cs) || podCondition(p, corev1.PodReady) != corev1.ConditionFalse || podCondition(p, corev1.ContainersReady) != corev1.ConditionFalse {
		t.Errorf("running before its readiness probe passed: container ready %v started %v, pod conditions %+v; want started, not ready", cs.Ready, cs.Started, p.Status.Conditions)
	}
	answer(false)
	ev.wait(t, "app Warning Unhealthy: Readiness probe failed: cat: /tmp/ready: No such file")

	answer(true)
	p = rec.wait(t, pod.UID, "Ready", func(p *corev1.Pod) bool { return appStatus(p).Ready })
	if podCondition(p, corev1.PodReady) != corev1.ConditionTrue || podCondition(p, corev1.ContainersReady) != corev1.ConditionTrue {
		t.Errorf("container ready, pod conditions %+v; want Ready and ContainersReady", p.Status.Conditions)
	}
	if n := f.execCount("app: cat /tmp/ready"); n < 2 {
		t.Errorf("%d probes ran `cat /tmp/ready`; want the command expanded, twice at least", n)
	}
	mu.Lock()
	if slices.ContainsFunc(timeouts, func(s int64) bool { return s != 4 }) {
		t.Errorf("ExecSync timeouts %v, want the probe's 4s", timeouts)
	}
	mu.Unlock()

	// Failing again: ready until failureThreshold (2) failures in a row.
	answer(false)
	if cs := appStatus(b.Pods()[0]); !cs.Ready {
		t.Error("not ready after one failure, want failureThreshold (2) failures")
	}
	answer(false)
	rec.wait(t, pod.UID, "not ready again", func(p *corev1.Pod) bool {
		return !appStatus(p).Ready && podCondition(p, corev1.PodReady) == corev1.ConditionFalse
	})
	// Later probes: answered until the backend closes.
	go func() {
		for {
			select {
			case answers <- true:
			case <-time.After(time.Second):
				return
			}
		}
	}()
}

// TestProbeKills: a liveness or startup probe failing failureThreshold
// times kills the container with the probe's grace period and the
// kubelet's events; it restarts unless the restart policy is Never.
func TestProbeKills(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		kind   podruntime.ProbeKind
		policy corev1.RestartPolicy
		event  string
	}{
		{"liveness", podruntime.Liveness, corev1.RestartPolicyAlways, "app Normal Killing: Container app failed liveness probe, will be restarted"},
		{"liveness never", podruntime.Liveness, corev1.RestartPolicyNever, "app Normal Killing: Container app failed liveness probe"},
		{"startup", podruntime.Startup, corev1.RestartPolicyAlways, "app Normal Killing: Container app failed startup probe, will be restarted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeRuntime(t)
			rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
			f.setExec(func(string, *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
				return &runtimeapi.ExecSyncResponse{ExitCode: 1, Stdout: []byte("sick")}, nil
			})
			b := newProbeBackend(t, f, rec, ev, tk, time.Nanosecond)
			probe := &corev1.Probe{ProbeHandler: execProbe("check"), FailureThreshold: 3, TerminationGracePeriodSeconds: ptrTo(int64(3))}
			c := corev1.Container{Name: "app", Image: "busybox:1"}
			if tc.kind == podruntime.Liveness {
				c.LivenessProbe = probe
			} else {
				c.StartupProbe = probe
			}
			pod := testPod("kill", tc.policy, c)
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
			worker := "app/" + tc.kind.String()
			tk.tick(t, worker)
			tk.tick(t, worker) // taken once the first probe ended: two at most
			f.mu.Lock()
			stops := slices.Clone(f.stops)
			f.mu.Unlock()
			if len(stops) != 0 {
				t.Fatalf("killed after two failures at most (stops %v), want failureThreshold (3)", stops)
			}
			tk.tick(t, worker)
			ev.wait(t, tc.event)
			if want := "app Warning Unhealthy: " + tc.kind.String() + " probe failed: sick"; !ev.has(want) {
				t.Errorf("no event %q; events %q", want, ev.list)
			}
			if tc.policy == corev1.RestartPolicyNever {
				rec.wait(t, pod.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
			} else {
				rec.wait(t, pod.UID, "restarted", func(p *corev1.Pod) bool {
					cs := appStatus(p)
					return cs.RestartCount == 1 && cs.State.Running != nil
				})
			}
			f.mu.Lock()
			stops = slices.Clone(f.stops)
			f.mu.Unlock()
			if !slices.Equal(stops, []int64{3}) {
				t.Errorf("StopContainer timeouts %v, want the probe's terminationGracePeriodSeconds [3] over the pod's 7", stops)
			}
		})
	}
}

// TestStartupProbe: until its startup probe passed a container is neither
// started nor ready and its liveness probe does not run; then the
// startup probe stops and the liveness probe runs.
func TestStartupProbe(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
	var up atomic.Bool
	f.setExec(func(_ string, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
		if r.Cmd[0] == "up" && !up.Load() {
			return &runtimeapi.ExecSyncResponse{ExitCode: 1}, nil
		}
		return &runtimeapi.ExecSyncResponse{}, nil
	})
	b := newProbeBackend(t, f, rec, ev, tk, time.Hour)
	pod := testPod("startup", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1",
		StartupProbe:  &corev1.Probe{ProbeHandler: execProbe("up"), FailureThreshold: 5},
		LivenessProbe: &corev1.Probe{ProbeHandler: execProbe("live")},
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	p := rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if cs := appStatus(p); started(cs) || cs.Ready {
		t.Errorf("started %v ready %v before the startup probe passed", cs.Started, cs.Ready)
	}
	tk.tick(t, "app/Startup")
	tk.tick(t, "app/Startup")
	tk.tick(t, "app/Liveness")
	tk.tick(t, "app/Liveness")
	if n := f.execCount("app: live"); n != 0 {
		t.Errorf("liveness probed %d times before the startup probe passed", n)
	}
	if n := f.execCount("app: up"); n == 0 {
		t.Error("the startup probe never ran")
	}
	up.Store(true)
	tk.tick(t, "app/Startup")
	p = rec.wait(t, pod.UID, "started", func(p *corev1.Pod) bool { return started(appStatus(p)) })
	if !appStatus(p).Ready {
		rec.wait(t, pod.UID, "ready", func(p *corev1.Pod) bool { return appStatus(p).Ready })
	}
	n := f.execCount("app: up")
	tk.tick(t, "app/Startup")
	tk.tick(t, "app/Startup")
	if m := f.execCount("app: up"); m != n {
		t.Errorf("startup probed %d times more once it passed, want none", m-n)
	}
	tk.tick(t, "app/Liveness")
	tk.tick(t, "app/Liveness")
	if n := f.execCount("app: live"); n == 0 {
		t.Error("liveness never probed once the container started")
	}
}

// TestSidecarStartupProbe: the init container after a sidecar starts only
// once the sidecar's startup probe passed.
func TestSidecarStartupProbe(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
	var up atomic.Bool
	f.setExec(func(string, *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
		if !up.Load() {
			return &runtimeapi.ExecSyncResponse{ExitCode: 1}, nil
		}
		return &runtimeapi.ExecSyncResponse{}, nil
	})
	b := newProbeBackend(t, f, rec, ev, tk, time.Hour)
	pod := testPod("sidecar", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1"})
	pod.Spec.InitContainers = []corev1.Container{
		{Name: "proxy", Image: "busybox:1", RestartPolicy: ptrTo(corev1.ContainerRestartPolicyAlways), StartupProbe: &corev1.Probe{ProbeHandler: execProbe("up"), FailureThreshold: 5}},
		{Name: "setup", Image: "busybox:1"},
	}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "running its sidecar", func(p *corev1.Pod) bool {
		cs := p.Status.InitContainerStatuses
		return len(cs) == 2 && cs[0].State.Running != nil
	})
	tk.tick(t, "proxy/Startup")
	tk.tick(t, "proxy/Startup")
	if f.running("setup") != nil {
		t.Fatal("the init container after the sidecar runs before the sidecar's startup probe passed")
	}
	up.Store(true)
	tk.tick(t, "proxy/Startup")
	rec.wait(t, pod.UID, "running its second init container", func(p *corev1.Pod) bool {
		cs := p.Status.InitContainerStatuses
		return len(cs) == 2 && cs[1].State.Running != nil && started(cs[0]) && cs[0].Ready
	})
}

// TestHTTPReadinessProbe: an HTTP probe reaches its host with its path,
// query and headers and the kubelet's User-Agent; a 500 fails it with the
// kubelet's message, a 200 makes the container ready.
func TestHTTPReadinessProbe(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	var mu sync.Mutex
	var got *http.Request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Clone(context.Background())
		mu.Unlock()
		if !healthy.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	port, _ := strconv.Atoi(u.Port())

	f := newFakeRuntime(t)
	rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
	b := newProbeBackend(t, f, rec, ev, tk, time.Hour)
	pod := testPod("http", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: int32(port)}}, //nolint:gosec // a port
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Host: "127.0.0.1", Port: intstr.FromString("web"), Path: "/healthz?deep=1",
			HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Probe", Value: "yes"}},
		}}},
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	tk.tick(t, "app/Readiness")
	ev.wait(t, "app Warning Unhealthy: Readiness probe failed: HTTP probe failed with statuscode: 500")
	healthy.Store(true)
	tk.tick(t, "app/Readiness")
	rec.wait(t, pod.UID, "Ready", func(p *corev1.Pod) bool { return appStatus(p).Ready })
	mu.Lock()
	defer mu.Unlock()
	if got.URL.Path != "/healthz" || got.URL.RawQuery != "deep=1" || got.Header.Get("X-Probe") != "yes" || got.UserAgent() != "kube-probe/1.37" || got.Header.Get("Accept") != "*/*" {
		t.Errorf("request %s %v, want /healthz?deep=1 with X-Probe, User-Agent kube-probe/1.37 and Accept */*", got.URL, got.Header)
	}
}

// TestPostStartHook: a postStart hook runs on the started container;
// until it returns the container is not reported running nor probed; one
// that fails kills it (FailedPostStartHook) and it restarts.
func TestPostStartHook(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	var fail atomic.Bool
	f.setExec(func(_ string, r *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
		if r.Cmd[0] != "hook" {
			return &runtimeapi.ExecSyncResponse{}, nil
		}
		entered <- struct{}{}
		<-release
		if fail.Load() {
			return &runtimeapi.ExecSyncResponse{ExitCode: 2, Stderr: []byte("bad")}, nil
		}
		return &runtimeapi.ExecSyncResponse{}, nil
	})
	b := newProbeBackend(t, f, rec, ev, tk, time.Nanosecond)
	pod := testPod("poststart", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1",
		Lifecycle:      &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"hook"}}}},
		ReadinessProbe: &corev1.Probe{ProbeHandler: execProbe("ready")},
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	<-entered
	tk.tick(t, "app/Readiness")
	tk.tick(t, "app/Readiness")
	if n := f.execCount("app: ready"); n != 0 {
		t.Errorf("readiness probed %d times while the postStart hook runs", n)
	}
	rec.mu.Lock()
	for _, p := range rec.seen[pod.UID] {
		if appStatus(p).State.Running != nil {
			t.Errorf("reported running while its postStart hook runs: %+v", appStatus(p))
		}
	}
	rec.mu.Unlock()
	release <- struct{}{}
	rec.wait(t, pod.UID, "Ready", func(p *corev1.Pod) bool { return appStatus(p).Ready })

	// A restart whose hook fails is killed and started again.
	fail.Store(true)
	f.exit(t, "app", 1)
	<-entered
	release <- struct{}{}
	ev.wait(t, "app Warning FailedPostStartHook: PostStartHook failed")
	ev.wait(t, "app Normal Killing: FailedPostStartHook")
	fail.Store(false)
	<-entered
	release <- struct{}{}
	rec.wait(t, pod.UID, "running after the failed hook", func(p *corev1.Pod) bool {
		cs := appStatus(p)
		return cs.RestartCount == 2 && cs.State.Running != nil
	})
}

// TestPreStopHook: deleting the pod runs the preStop hook first, and the
// stop gets what is left of the grace period; a failing hook is reported
// and the container stopped all the same.
func TestPreStopHook(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		handler corev1.LifecycleHandler
		stop    int64
		event   string
	}{
		{"sleep", corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 1}}, 6, ""},
		{"exec failing", corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"drain"}}}, 7, "app Warning FailedPreStopHook: PreStopHook failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeRuntime(t)
			rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
			f.setExec(func(string, *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
				return &runtimeapi.ExecSyncResponse{ExitCode: 1}, nil
			})
			b := newProbeBackend(t, f, rec, ev, tk, time.Hour)
			pod := testPod("prestop", corev1.RestartPolicyAlways, corev1.Container{
				Name: "app", Image: "busybox:1", Lifecycle: &corev1.Lifecycle{PreStop: &tc.handler},
			})
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
			if err := b.DeletePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, pod.UID, "terminal", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
			ev.wait(t, "app Normal Killing: Stopping container app")
			if tc.event != "" {
				ev.wait(t, tc.event)
			}
			if tc.handler.Exec != nil && f.execCount("app: drain") != 1 {
				t.Errorf("execs %q, want the preStop hook once", f.execs)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if !slices.Equal(f.stops, []int64{tc.stop}) {
				t.Errorf("StopContainer timeouts %v, want [%d]: the grace period (7s) less the hook's time", f.stops, tc.stop)
			}
		})
	}
}

// TestExecProbeOutcomes: as the kubelet's exec prober, an exec that times
// out fails the probe with the kubelet's message, one the runtime cannot
// run errors (the result stays as it was), and the output kept is 10 KiB.
func TestExecProbeOutcomes(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec, ev, tk := newRecorder(), newEventLog(), &ticks{}
	b := newProbeBackend(t, f, rec, ev, tk, time.Hour)
	pod := testPod("exec", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1"})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	pr := b.get(pod.UID)
	id := pr.w.Containers()[0].ID
	for _, tc := range []struct {
		name   string
		resp   *runtimeapi.ExecSyncResponse
		err    error
		want   podruntime.Outcome
		output string
		errs   bool
	}{
		{"timeout", nil, status.Error(codes.DeadlineExceeded, "timeout 1s exceeded"), podruntime.OutcomeFailure, `command timed out: "check" timed out after 1s`, false},
		{"runtime error", nil, status.Error(codes.Unavailable, "gone"), podruntime.OutcomeUnknown, "", true},
		{"exit 1", &runtimeapi.ExecSyncResponse{ExitCode: 1, Stdout: []byte("out "), Stderr: []byte("err")}, nil, podruntime.OutcomeFailure, "out err", false},
		{"long output", &runtimeapi.ExecSyncResponse{Stdout: []byte(strings.Repeat("y", 20<<10))}, nil, podruntime.OutcomeSuccess, strings.Repeat("y", 10<<10), false},
	} {
		f.setExec(func(string, *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
			return tc.resp, tc.err
		})
		out, output, err := podruntime.ExecProbe(context.Background(), pr.Exec, id, []string{"check"}, time.Second)
		if out != tc.want || output != tc.output || (err != nil) != tc.errs {
			t.Errorf("%s: %s %.40q %v, want %s %.40q (error %v)", tc.name, out, output, err, tc.want, tc.output, tc.errs)
		}
	}
}
