package process

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// events records the container events a backend reports.
type events struct {
	mu  sync.Mutex
	got []string
	ch  chan struct{}
}

func (e *events) event(_ *corev1.Pod, container, eventType, reason, message string) {
	e.mu.Lock()
	e.got = append(e.got, container+" "+eventType+" "+reason+": "+message)
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

// wait returns once an event containing want was recorded.
func (e *events) wait(t *testing.T, want string) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		found := slices.ContainsFunc(e.got, func(s string) bool { return strings.Contains(s, want) })
		got := slices.Clone(e.got)
		e.mu.Unlock()
		if found {
			return
		}
		select {
		case <-e.ch:
		case <-deadline.C:
			t.Fatalf("no event %q; got %q", want, got)
		}
	}
}

// probeBackend is a backend whose probes tick when the test says.
func probeBackend(t *testing.T, rec *recorder, ev *events, tick <-chan time.Time) *Backend {
	t.Helper()
	b, err := New(Config{
		Config:         backend.Config{Notify: rec.notify, Event: ev.event, NodeIP: "127.0.0.1"},
		Dir:            t.TempDir(),
		BackoffInitial: 10 * time.Millisecond,
		BackoffMax:     40 * time.Millisecond,
		PollInterval:   20 * time.Millisecond,
		probeTicker: func(string, time.Duration) (<-chan time.Time, func()) {
			return tick, func() {}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func exitOrKill(t *testing.T, b *Backend, pod *corev1.Pod, rec *recorder) {
	t.Helper()
	pod = pod.DeepCopy()
	pod.DeletionGracePeriodSeconds = new(int64)
	if err := b.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "ended", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	})
}

// TestProcessReadinessProbe: the process backend probes as the cri
// backend does (podruntime's workers): a container whose exec readiness
// probe fails is running but not ready, and ready once it passes; the
// command runs in the container's environment.
func TestProcessReadinessProbe(t *testing.T) {
	t.Parallel()
	rec, ev, tick := newRecorder(), &events{ch: make(chan struct{}, 1)}, make(chan time.Time)
	b := probeBackend(t, rec, ev, tick)
	flag := filepath.Join(t.TempDir(), "ready")
	c := sh("app", "exec sleep 600")
	c.Env = append(c.Env, corev1.EnvVar{Name: "FLAG", Value: flag})
	c.ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-f", "$(FLAG)"}}}}
	pod := testPod("ready", corev1.RestartPolicyAlways, nil, c)
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	defer exitOrKill(t, b, pod, rec)
	running := func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	}
	rec.wait(t, pod.UID, "running", running)
	tick <- time.Now()
	ev.wait(t, "app Warning Unhealthy: Readiness probe failed")
	p := rec.wait(t, pod.UID, "running, not ready", func(p *corev1.Pod) bool { return running(p) && !p.Status.ContainerStatuses[0].Ready })
	if cs := p.Status.ContainerStatuses[0]; cs.Started == nil || !*cs.Started {
		t.Errorf("container not started: %+v", cs)
	}
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tick <- time.Now()
	rec.wait(t, pod.UID, "ready", func(p *corev1.Pod) bool {
		return running(p) && p.Status.ContainerStatuses[0].Ready && podReady(p)
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestProcessLivenessProbeKills: a failing liveness probe kills the
// container with the kubelet's message, and it restarts.
func TestProcessLivenessProbeKills(t *testing.T) {
	t.Parallel()
	rec, ev, tick := newRecorder(), &events{ch: make(chan struct{}, 1)}, make(chan time.Time)
	b := probeBackend(t, rec, ev, tick)
	c := sh("app", "exec sleep 600")
	c.LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}, FailureThreshold: 1}
	pod := testPod("live", corev1.RestartPolicyAlways, nil, c)
	pod.Spec.TerminationGracePeriodSeconds = new(int64)
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	defer exitOrKill(t, b, pod, rec)
	rec.wait(t, pod.UID, "running", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	tick <- time.Now()
	ev.wait(t, "app Normal Killing: Container app failed liveness probe, will be restarted")
	rec.wait(t, pod.UID, "restarted", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount >= 1 && cs[0].LastTerminationState.Terminated != nil
	})
}

// TestProcessLifecycleHooks: postStart runs once the container started
// (and a failing one kills it with FailedPostStartHook), preStop runs
// before the deletion's SIGTERM.
func TestProcessLifecycleHooks(t *testing.T) {
	t.Parallel()
	rec, ev := newRecorder(), &events{ch: make(chan struct{}, 1)}
	b := probeBackend(t, rec, ev, nil)
	dir := t.TempDir()
	// The postStart hook waits for the command to have set its trap: a
	// SIGTERM before would be lost, as with a runtime's container init.
	c := sh("app", "trap 'echo term >> "+dir+"/order; exit 0' TERM; touch "+dir+"/up; while :; do sleep 0.1; done")
	c.Lifecycle = &corev1.Lifecycle{
		PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "until [ -e " + dir + "/up ]; do sleep 0.01; done; echo $GREETING > " + dir + "/poststart"}}},
		PreStop:   &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "echo prestop >> " + dir + "/order"}}},
	}
	pod := testPod("hooks", corev1.RestartPolicyNever, nil, c)
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "running", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	if err := b.DeletePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "ended", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if b, err := os.ReadFile(filepath.Join(dir, "poststart")); err != nil || string(b) != "hello\n" {
		t.Errorf("postStart wrote %q (%v), want hello from the container's environment", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "order")); err != nil || string(b) != "prestop\nterm\n" {
		t.Errorf("order %q (%v), want the preStop hook before SIGTERM", b, err)
	}

	failing := sh("app", "exec sleep 600")
	failing.Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"false"}}}}
	pod = testPod("poststart-fails", corev1.RestartPolicyNever, nil, failing)
	pod.Spec.TerminationGracePeriodSeconds = new(int64)
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	ev.wait(t, "app Warning FailedPostStartHook: PostStartHook failed")
	ev.wait(t, "app Normal Killing: FailedPostStartHook")
	rec.wait(t, pod.UID, "failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
}
