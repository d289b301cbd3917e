package process

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// recorder collects notifications and lets tests wait for a condition.
type recorder struct {
	mu   sync.Mutex
	last map[types.UID]*corev1.Pod
	ch   chan struct{}
}

func newRecorder() *recorder {
	return &recorder{last: map[types.UID]*corev1.Pod{}, ch: make(chan struct{}, 1)}
}

func (r *recorder) notify(p *corev1.Pod) {
	r.mu.Lock()
	r.last[p.UID] = p
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

func (r *recorder) wait(t *testing.T, uid types.UID, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		p := r.last[uid]
		r.mu.Unlock()
		if p != nil && cond(p) {
			return p
		}
		select {
		case <-r.ch:
		case <-deadline.C:
			t.Fatalf("waiting for %s: last status %+v", what, p)
		}
	}
}

func newBackend(t *testing.T, dir string, rec *recorder) *Backend {
	t.Helper()
	b, err := New(Config{
		Config: backend.Config{
			Notify: rec.notify,
			ContainerEnv: func(_ context.Context, _ *corev1.Pod, c string) ([]corev1.EnvVar, error) {
				return []corev1.EnvVar{{Name: "DEVICES", Value: "dev-" + c}}, nil
			},
			NodeIP: "127.0.0.1",
		},
		Dir:            dir,
		BackoffInitial: 10 * time.Millisecond,
		BackoffMax:     40 * time.Millisecond,
		PollInterval:   20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testPod(name string, policy corev1.RestartPolicy, init []corev1.Container, app ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{RestartPolicy: policy, InitContainers: init, Containers: app},
	}
}

func sh(name, script string) corev1.Container {
	return corev1.Container{Name: name, Command: []string{"sh", "-c", script}, Env: []corev1.EnvVar{{Name: "GREETING", Value: "hello"}}}
}

func phase(p corev1.PodPhase) func(*corev1.Pod) bool {
	return func(pod *corev1.Pod) bool { return pod.Status.Phase == p }
}

func readLogs(t *testing.T, b *Backend, pod, container string, opts backend.LogOptions) string {
	t.Helper()
	rc, err := b.Logs(context.Background(), "ns", pod, container, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func TestLifecycle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		want      corev1.PodPhase
		check     func(t *testing.T, b *Backend, p *corev1.Pod)
		wantCodes map[string]int32
	}{
		{
			name:      "succeeds with env and device env",
			pod:       testPod("ok", corev1.RestartPolicyNever, nil, sh("app", `echo "$GREETING $DEVICES $HOSTNAME"; echo oops >&2`)),
			want:      corev1.PodSucceeded,
			wantCodes: map[string]int32{"app": 0},
			check: func(t *testing.T, b *Backend, _ *corev1.Pod) {
				logs := readLogs(t, b, "ok", "app", backend.LogOptions{Tail: -1})
				if !strings.Contains(logs, "hello dev-app ok\n") || !strings.Contains(logs, "oops\n") {
					t.Errorf("logs %q", logs)
				}
				if got := readLogs(t, b, "ok", "app", backend.LogOptions{Tail: 1, Timestamps: true}); strings.Count(got, "\n") != 1 || !strings.Contains(got, "Z ") {
					t.Errorf("tail=1 with timestamps: %q", got)
				}
				if got := readLogs(t, b, "ok", "app", backend.LogOptions{Tail: -1, SinceTime: time.Now().Add(time.Hour)}); got != "" {
					t.Errorf("since the future: %q", got)
				}
			},
		},
		{
			name:      "fails with exit code",
			pod:       testPod("fail", corev1.RestartPolicyNever, nil, sh("app", "exit 3")),
			want:      corev1.PodFailed,
			wantCodes: map[string]int32{"app": 3},
		},
		{
			name: "init containers in order",
			pod: testPod("init", corev1.RestartPolicyNever,
				[]corev1.Container{sh("one", "echo one > order"), sh("two", "echo two >> order")},
				sh("app", "cat order")),
			want:      corev1.PodSucceeded,
			wantCodes: map[string]int32{"app": 0},
			check: func(t *testing.T, b *Backend, _ *corev1.Pod) {
				if logs := readLogs(t, b, "init", "app", backend.LogOptions{Tail: -1}); logs != "one\ntwo\n" {
					t.Errorf("logs %q, want one then two", logs)
				}
			},
		},
		{
			name: "failed init container fails the pod",
			pod: testPod("initfail", corev1.RestartPolicyNever,
				[]corev1.Container{sh("one", "exit 1")}, sh("app", "echo never")),
			want: corev1.PodFailed,
		},
		{
			name:      "OnFailure restarts until success",
			pod:       testPod("retry", corev1.RestartPolicyOnFailure, nil, sh("app", `n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; [ $n -ge 2 ]`)),
			want:      corev1.PodSucceeded,
			wantCodes: map[string]int32{"app": 0},
			check: func(t *testing.T, b *Backend, p *corev1.Pod) {
				if rc := p.Status.ContainerStatuses[0].RestartCount; rc != 2 {
					t.Errorf("restart count %d, want 2", rc)
				}
				if prev := readLogs(t, b, "retry", "app", backend.LogOptions{Tail: -1, Previous: true}); prev != "" {
					t.Errorf("previous logs %q", prev)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder()
			b := newBackend(t, t.TempDir(), rec)
			defer b.Close()
			if err := b.CreatePod(context.Background(), tc.pod); err != nil {
				t.Fatal(err)
			}
			p := rec.wait(t, tc.pod.UID, string(tc.want), phase(tc.want))
			for name, code := range tc.wantCodes {
				for _, s := range p.Status.ContainerStatuses {
					if s.Name == name && (s.State.Terminated == nil || s.State.Terminated.ExitCode != code) {
						t.Errorf("container %s state %+v, want exit code %d", name, s.State, code)
					}
				}
			}
			if tc.check != nil {
				tc.check(t, b, p)
			}
		})
	}
}

func TestNoCommand(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := newBackend(t, t.TempDir(), rec)
	defer b.Close()
	pod := testPod("nocmd", corev1.RestartPolicyNever, nil, corev1.Container{Name: "app", Image: "busybox"})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	p := rec.wait(t, pod.UID, "a config error", func(p *corev1.Pod) bool {
		w := p.Status.ContainerStatuses[0].State.Waiting
		return w != nil && w.Reason == podruntime.ReasonCreateContainerConfigError
	})
	if msg := p.Status.ContainerStatuses[0].State.Waiting.Message; !strings.Contains(msg, "command") {
		t.Errorf("message %q does not say what to set", msg)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("phase %s, want Pending", p.Status.Phase)
	}
}

func TestGracefulDelete(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		script string
		grace  int64
		code   int32
	}{
		{"SIGTERM honoured", "trap 'exit 7' TERM; echo ready; while :; do sleep 0.05; done", 30, 7},
		{"SIGKILL after the grace period", "trap '' TERM; echo ready; while :; do sleep 0.05; done", 1, 137},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := newRecorder()
			b := newBackend(t, t.TempDir(), rec)
			defer b.Close()
			pod := testPod("grace", corev1.RestartPolicyAlways, nil, sh("app", tc.script))
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, pod.UID, "running", phase(corev1.PodRunning))
			// Wait until the trap is installed (the script says so).
			waitLogs(t, b, "grace", "ready")
			del := pod.DeepCopy()
			now := metav1.Now()
			del.DeletionTimestamp, del.DeletionGracePeriodSeconds = &now, &tc.grace
			if err := b.DeletePod(context.Background(), del); err != nil {
				t.Fatal(err)
			}
			p := rec.wait(t, pod.UID, "terminal", func(p *corev1.Pod) bool {
				return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
			})
			st := p.Status.ContainerStatuses[0].State.Terminated
			if st == nil || st.ExitCode != tc.code {
				t.Fatalf("terminated %+v, want exit code %d", st, tc.code)
			}
			if id := p.Status.ContainerStatuses[0].ContainerID; st.ContainerID != id || id == "" {
				t.Errorf("terminated container ID %q, want the container's %q (as the kubelet reports it)", st.ContainerID, id)
			}
			if err := b.Forget(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(b.cfg.Dir, string(pod.UID))); !os.IsNotExist(err) {
				t.Errorf("pod directory left after Forget: %v", err)
			}
		})
	}
}

func waitLogs(t *testing.T, b *Backend, pod, substr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rc, err := b.Logs(ctx, "ns", pod, "app", backend.LogOptions{Tail: -1, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	buf := make([]byte, 4096)
	var got strings.Builder
	for !strings.Contains(got.String(), substr) {
		n, err := rc.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			t.Fatalf("following logs: %v; got %q", err, got.String())
		}
	}
}

// TestAdoptAfterRestart closes the backend while a process runs, opens a
// new one on the same directory and checks that the process is followed:
// its later output reaches the log and its exit code the status.
func TestAdoptAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := newRecorder()
	b := newBackend(t, dir, rec)
	gate := filepath.Join(dir, "gate")
	pod := testPod("adopt", corev1.RestartPolicyNever, nil, sh("app", "echo before; while [ ! -e "+gate+" ]; do sleep 0.02; done; echo after; exit 4"))
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	running := rec.wait(t, pod.UID, "running", phase(corev1.PodRunning))
	waitLogs(t, b, "adopt", "before")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	rec2 := newRecorder()
	b2 := newBackend(t, dir, rec2)
	defer b2.Close()
	pods := b2.Pods()
	if len(pods) != 1 || pods[0].UID != pod.UID || pods[0].Status.Phase != corev1.PodRunning {
		t.Fatalf("adopted pods %+v, want the running pod", pods)
	}
	if id := pods[0].Status.ContainerStatuses[0].ContainerID; id != running.Status.ContainerStatuses[0].ContainerID {
		t.Fatalf("adopted container %s, want the same process %s", id, running.Status.ContainerStatuses[0].ContainerID)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := rec2.wait(t, pod.UID, "failed with the process's exit code", phase(corev1.PodFailed))
	st := p.Status.ContainerStatuses[0].State.Terminated
	if st == nil || st.ExitCode != 4 {
		t.Fatalf("terminated %+v, want exit code 4", st)
	}
	if want := running.Status.ContainerStatuses[0].ContainerID; st.ContainerID != want {
		t.Errorf("terminated container ID %q, want the adopted process's %q", st.ContainerID, want)
	}
	if logs := readLogs(t, b2, "adopt", "app", backend.LogOptions{Tail: -1}); logs != "before\nafter\n" {
		t.Errorf("logs %q, want before and after", logs)
	}
}

func TestPodStatsAndExec(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := newBackend(t, t.TempDir(), rec)
	defer b.Close()
	pod := testPod("stats", corev1.RestartPolicyNever, nil, sh("app", "echo ready; while :; do sleep 0.05; done"))
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "running", phase(corev1.PodRunning))
	waitLogs(t, b, "stats", "ready")
	stats, err := b.PodStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(stats) != 1 || len(stats[0].Containers) != 1 || *stats[0].Containers[0].Memory.RSSBytes == 0 {
		t.Fatalf("stats %+v, want one container with resident memory", stats)
	}
	var out strings.Builder
	err = b.Exec(context.Background(), "ns", "stats", "app", []string{"sh", "-c", "echo $GREETING $DEVICES; exit 5"}, backend.ExecIO{Stdout: &out, Stderr: &out})
	var ce interface{ ExitStatus() int }
	if !errors.As(err, &ce) || ce.ExitStatus() != 5 {
		t.Fatalf("exec error %v, want exit status 5", err)
	}
	if out.String() != "hello dev-app\n" {
		t.Errorf("exec output %q, want the container's environment", out.String())
	}
	if err := b.Forget(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
}

// TestStopPods: a closed backend leaves its pods running (for the next
// one to adopt); StopPods ends them, a container that ignores SIGTERM by
// SIGKILL after the grace period, and leaves a finished pod alone.
func TestStopPods(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := newRecorder()
	b := newBackend(t, dir, rec)
	polite := testPod("polite", corev1.RestartPolicyNever, nil, sh("app", "echo ready.; sleep 300 & wait"))
	stubborn := testPod("stubborn", corev1.RestartPolicyNever, nil, sh("app", `trap "" TERM; echo ready.; while :; do sleep 0.05; done`))
	done := testPod("done", corev1.RestartPolicyNever, nil, sh("app", "exit 0"))
	for _, p := range []*corev1.Pod{polite, stubborn, done} {
		if err := b.CreatePod(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	rec.wait(t, polite.UID, "running", phase(corev1.PodRunning))
	rec.wait(t, stubborn.UID, "running", phase(corev1.PodRunning))
	rec.wait(t, done.UID, "succeeded", phase(corev1.PodSucceeded))
	// Each container leads its own process group (in a PID namespace of
	// its own where the host allows one): the leader's host PID is in
	// the pod's state.
	groups := map[string]int{}
	for _, p := range []*corev1.Pod{polite, stubborn} {
		waitLogs(t, b, p.Name, ".\n")
		data, err := os.ReadFile(filepath.Join(dir, string(p.UID), "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var st state
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		groups[p.Name] = st.Procs["app"].PID
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for name, pgid := range groups {
		if len(groupMembers(pgid)) == 0 {
			t.Fatalf("%s's processes (group %d) ended with their backend: they are kept for adoption", name, pgid)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stopped, err := StopPods(ctx, dir, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ns/polite", "ns/stubborn"}; !slices.Equal(stopped, want) {
		t.Errorf("StopPods stopped %v, want %v", stopped, want)
	}
	for name, pgid := range groups {
		if m := groupMembers(pgid); len(m) > 0 {
			t.Errorf("%s's processes %v still run after StopPods", name, m)
		}
	}
	if again, err := StopPods(ctx, dir, time.Second); err != nil || len(again) != 0 {
		t.Errorf("StopPods again: %v, %v; want nothing to stop", again, err)
	}
}
