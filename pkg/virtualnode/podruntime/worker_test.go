package podruntime

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeRunner runs containers in memory: each Start makes a run that
// stays running until the test ends it (exit) or Stop kills it.
type fakeRunner struct {
	mu       sync.Mutex
	w        *Worker
	n        int
	runs     map[string]*fakeCtr // by ID
	starts   []string            // container names, in start order
	stops    []int64             // grace of each Stop
	startErr map[string]error    // the next Start of a container fails so
	ended    int
	torn     int
}

type fakeCtr struct {
	name string
	code int32
	done bool
	at   time.Time
}

func newFakeRunner() *fakeRunner {
	return &fakeRunner{runs: map[string]*fakeCtr{}, startErr: map[string]error{}}
}

func (f *fakeRunner) Prepare(context.Context) (bool, error) { return true, nil }

func (f *fakeRunner) Start(_ context.Context, c *corev1.Container, attempt int32) (Started, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.startErr[c.Name]; err != nil {
		delete(f.startErr, c.Name)
		return Started{}, err
	}
	f.n++
	id := fmt.Sprintf("%s-%d-%d", c.Name, attempt, f.n)
	f.runs[id] = &fakeCtr{name: c.Name, at: time.Now()}
	f.starts = append(f.starts, c.Name)
	return Started{ID: id, ImageID: "sha256:1"}, nil
}

func (f *fakeRunner) Observe(_ context.Context, _ *corev1.Container, id string) (Observed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.runs[id]
	if r == nil {
		return Observed{}, ErrContainerGone
	}
	if !r.done {
		return Observed{Running: true, StartedAt: r.at}, nil
	}
	return Observed{Terminated: &corev1.ContainerStateTerminated{ExitCode: r.code, Reason: ExitReason(r.code), FinishedAt: metav1.Now()}}, nil
}

func (f *fakeRunner) Stop(_ context.Context, id string, grace int64) {
	f.mu.Lock()
	f.stops = append(f.stops, grace)
	if r := f.runs[id]; r != nil && !r.done {
		r.done, r.code = true, 137
	}
	f.mu.Unlock()
}

func (f *fakeRunner) Remove(_ context.Context, id string) {
	f.mu.Lock()
	delete(f.runs, id)
	f.mu.Unlock()
}

func (f *fakeRunner) Exec(context.Context, string, []string, time.Duration) ([]byte, int32, error) {
	return nil, 0, nil
}
func (f *fakeRunner) ContainerID(id string) string { return "fake://" + id }
func (f *fakeRunner) PodIP() string                { return "" }
func (f *fakeRunner) Ended(context.Context)        { f.mu.Lock(); f.ended++; f.mu.Unlock() }
func (f *fakeRunner) Teardown(context.Context)     { f.mu.Lock(); f.torn++; f.mu.Unlock() }

// exit ends the running run of container name with code.
func (f *fakeRunner) exit(t *testing.T, name string, code int32) {
	t.Helper()
	f.mu.Lock()
	var found bool
	for _, r := range f.runs {
		if r.name == name && !r.done {
			r.done, r.code, found = true, code, true
		}
	}
	f.mu.Unlock()
	if !found {
		t.Fatalf("no run of %s to end", name)
	}
	f.w.Wake()
}

func (f *fakeRunner) startOrder() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.starts)
}

// statuses receives every status the worker publishes.
type statuses chan *corev1.Pod

// until returns the first published pod ok accepts.
func (s statuses) until(t *testing.T, what string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case p := <-s:
			if ok(p) {
				return p
			}
		case <-timeout:
			t.Fatalf("no status with %s", what)
		}
	}
}

func startWorker(t *testing.T, pod *corev1.Pod, f *fakeRunner, before func(*Worker)) (*Worker, statuses) {
	t.Helper()
	ch := make(statuses, 1000)
	w := NewWorker(pod, f, WorkerConfig{
		NodeIP: "10.0.0.1", BackoffInitial: 50 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		PollInterval: time.Hour, // the fake wakes the worker
		Notify:       func(p *corev1.Pod) { ch <- p },
	})
	f.w = w
	if before != nil {
		before(w)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go w.Run(ctx)
	t.Cleanup(func() {
		cancel()
		<-w.Done()
	})
	return w, ch
}

func workerPod(policy corev1.RestartPolicy, init []corev1.Container, app ...string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid"},
		Spec:       corev1.PodSpec{RestartPolicy: policy, InitContainers: init},
	}
	for _, n := range app {
		pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: n, Image: "img"})
	}
	return pod
}

func state(p *corev1.Pod, name string) corev1.ContainerStatus {
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if s.Name == name {
			return s
		}
	}
	return corev1.ContainerStatus{}
}

func running(name string) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool { return state(p, name).State.Running != nil }
}

// TestWorkerStartOrder: an init container runs alone; after it succeeds
// the sidecar starts, then the app container.
func TestWorkerStartOrder(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	f := newFakeRunner()
	_, ch := startWorker(t, workerPod(corev1.RestartPolicyAlways, []corev1.Container{
		{Name: "init", Image: "img"}, {Name: "side", Image: "img", RestartPolicy: &always},
	}, "app"), f, nil)
	p := ch.until(t, "init running", running("init"))
	if got := f.startOrder(); !slices.Equal(got, []string{"init"}) {
		t.Fatalf("started %v while init runs, want only init", got)
	}
	if s := state(p, "app"); s.State.Waiting == nil || s.State.Waiting.Reason != ReasonPodInitializing {
		t.Errorf("app while init runs: %+v, want waiting PodInitializing", s.State)
	}
	f.exit(t, "init", 0)
	ch.until(t, "app running", running("app"))
	if got := f.startOrder(); !slices.Equal(got, []string{"init", "side", "app"}) {
		t.Errorf("start order %v, want init, side, app", got)
	}
}

// TestWorkerRestartPolicy: OnFailure restarts a failed container after
// its back-off (CrashLoopBackOff meanwhile) with its last state kept, and
// not one that succeeded; the pod then ends, once.
func TestWorkerRestartPolicy(t *testing.T) {
	t.Parallel()
	f := newFakeRunner()
	w, ch := startWorker(t, workerPod(corev1.RestartPolicyOnFailure, nil, "app"), f, nil)
	ch.until(t, "app running", running("app"))
	f.exit(t, "app", 3)
	p := ch.until(t, "app restarted", func(p *corev1.Pod) bool {
		return state(p, "app").RestartCount == 1 && state(p, "app").State.Running != nil
	})
	if last := state(p, "app").LastTerminationState.Terminated; last == nil || last.ExitCode != 3 {
		t.Errorf("last state %+v, want terminated with 3", state(p, "app").LastTerminationState)
	}
	f.exit(t, "app", 0)
	p = ch.until(t, "succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if s := state(p, "app"); s.RestartCount != 1 || s.ContainerID == "" {
		t.Errorf("final status %+v, want one restart and its container ID", s)
	}
	if got := len(f.startOrder()); got != 2 {
		t.Errorf("%d starts, want 2", got)
	}
	w.Stop(0)
	<-w.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ended != 1 {
		t.Errorf("Ended called %d times, want 1", f.ended)
	}
}

// TestWorkerStartErrors: a start's Waiting reason is reported and the
// start tried again; an image pull failure waits as ImagePullBackOff.
func TestWorkerStartErrors(t *testing.T) {
	t.Parallel()
	f := newFakeRunner()
	f.startErr["app"] = &WaitError{Reason: ReasonErrImagePull, Message: "no such image"}
	f.startErr["other"] = &WaitError{Reason: ReasonCreateContainerConfigError, Message: `secret "s" not found`}
	_, ch := startWorker(t, workerPod(corev1.RestartPolicyAlways, nil, "app", "other"), f, nil)
	ch.until(t, "ErrImagePull and the config error", func(p *corev1.Pod) bool {
		a, o := state(p, "app").State.Waiting, state(p, "other").State.Waiting
		return a != nil && a.Reason == ReasonErrImagePull && o != nil && o.Reason == ReasonCreateContainerConfigError && o.Message == `secret "s" not found`
	})
	ch.until(t, "both running after their back-off", func(p *corev1.Pod) bool {
		return running("app")(p) && running("other")(p)
	})
}

// TestWorkerStop: deleting the pod kills what runs with the grace
// period (the kubelet's minimum at least), a shorter deletion kills it
// again at once, and the pod is torn down with every container
// terminated.
func TestWorkerStop(t *testing.T) {
	t.Parallel()
	f := newFakeRunner()
	w, ch := startWorker(t, workerPod(corev1.RestartPolicyAlways, nil, "app"), f, nil)
	ch.until(t, "app running", running("app"))
	w.Stop(30 * time.Second)
	p := ch.until(t, "terminated", func(p *corev1.Pod) bool { return state(p, "app").State.Terminated != nil })
	if p.Status.Phase != corev1.PodFailed {
		t.Errorf("phase %s after a kill, want Failed", p.Status.Phase)
	}
	<-w.Done()
	f.mu.Lock()
	defer f.mu.Unlock()
	if !slices.Equal(f.stops, []int64{30}) || f.torn != 1 {
		t.Errorf("stops %v, teardowns %d; want [30] and 1", f.stops, f.torn)
	}
}

// TestWorkerRestore: a pod restored with a container that succeeded
// under restartPolicy Never is not started again, and one adopted
// running is followed, not started.
func TestWorkerRestore(t *testing.T) {
	t.Parallel()
	pod := workerPod(corev1.RestartPolicyNever, nil, "done", "live")
	finished := metav1.NewTime(time.Now().Truncate(time.Second))
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{
		{Name: "done", RestartCount: 0, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: ReasonCompleted, FinishedAt: finished}}},
		{Name: "live", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: finished}}},
	}
	f := newFakeRunner()
	f.runs["live-0-0"] = &fakeCtr{name: "live", at: finished.Time}
	_, ch := startWorker(t, pod, f, func(w *Worker) {
		w.Restore()
		w.Adopt("live", Adopted{ID: "live-0-0", StartedAt: finished.Time})
	})
	ch.until(t, "live running", running("live"))
	f.exit(t, "live", 0)
	ch.until(t, "succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if got := f.startOrder(); len(got) != 0 {
		t.Errorf("started %v, want nothing", got)
	}
}
