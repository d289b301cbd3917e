package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// podRun is one pod's processes: the runs podruntime's worker asks for,
// each container's command as a host process (it implements
// podruntime.Runner). Its state, with the processes, is persisted under
// the pod's directory at each change of status.
type podRun struct {
	b   *Backend
	dir string
	pod *corev1.Pod // as admitted; the worker has its status
	w   *podruntime.Worker

	mu sync.Mutex
	// procs are each container's current or last process, restarts the
	// run it is (its log and exit files are named for it).
	procs    map[string]*proc
	restarts map[string]int32
}

func newPodRun(b *Backend, pod *corev1.Pod) *podRun {
	pr := &podRun{
		b:        b,
		dir:      filepath.Join(b.cfg.Dir, string(pod.UID)),
		pod:      pod,
		procs:    map[string]*proc{},
		restarts: map[string]int32{},
	}
	for _, s := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		pr.restarts[s.Name] = s.RestartCount
	}
	pr.w = podruntime.NewWorker(pod, pr, podruntime.WorkerConfig{
		NodeIP: b.cfg.NodeIP, BackoffInitial: b.cfg.BackoffInitial, BackoffMax: b.cfg.BackoffMax,
		PollInterval: b.cfg.PollInterval, Notify: pr.persist, Event: b.cfg.Event, Logger: b.log,
		ProbeTicker: b.cfg.probeTicker,
	})
	return pr
}

// Pod implements podruntime.Run.
func (pr *podRun) Pod() *corev1.Pod { return pr.pod }

// Snapshot implements podruntime.Run.
func (pr *podRun) Snapshot() *corev1.Pod { return pr.w.Snapshot() }

func (pr *podRun) key() string { return pr.pod.Namespace + "/" + pr.pod.Name }

// persist writes the pod, its status and its processes to state.json,
// then reports the status.
func (pr *podRun) persist(pod *corev1.Pod) {
	pr.mu.Lock()
	st := state{Pod: pod, Procs: map[string]procState{}}
	for name, p := range pr.procs {
		st.Procs[name] = procState{PID: p.pid, StartTicks: p.startTicks, RestartCount: pr.restarts[name]}
	}
	data, err := json.Marshal(&st)
	pr.mu.Unlock()
	if err == nil {
		err = writeAtomic(filepath.Join(pr.dir, "state.json"), data)
	}
	if err != nil {
		pr.b.log.Error("Persisting pod state", "pod", pr.key(), "err", err)
	}
	pr.b.cfg.Notify(pod)
}

// stateFileMode is the mode of state.json: only the node's user reads
// what it knows of a pod.
const stateFileMode = 0o600

// writeAtomic replaces path with data, readable by its owner only.
func writeAtomic(path string, data []byte) error {
	return fileutil.WriteAtomic(path, data, stateFileMode)
}

// restore takes the pod's containers from its persisted state: their
// statuses, and the processes of a previous run that were running, which
// are followed again (or reported as their exit files say when they
// ended while the node was away).
func (pr *podRun) restore(procs map[string]procState) {
	pr.w.Restore()
	running := map[string]metav1.Time{}
	for _, s := range append(append([]corev1.ContainerStatus{}, pr.pod.Status.InitContainerStatuses...), pr.pod.Status.ContainerStatuses...) {
		if s.State.Running != nil {
			running[s.Name] = s.State.Running.StartedAt
		}
	}
	for name, ps := range procs {
		started, ok := running[name]
		if !ok || ps.RestartCount != pr.restarts[name] {
			continue
		}
		p := pr.adoptProc(name, ps, started)
		if p == nil {
			// Gone while we were away: its exit file says how it ended.
			p = &proc{pid: ps.PID, startTicks: ps.StartTicks, started: started, exited: make(chan struct{}), finished: podruntime.Now()}
			p.code, p.reason = readExit(pr.exitFile(name, ps.RestartCount))
			close(p.exited)
		}
		pr.procs[name] = p
		pr.w.Adopt(name, podruntime.Adopted{ID: p.id(), Restarts: ps.RestartCount, StartedAt: started.Time})
	}
}

// Prepare implements podruntime.Runner: the pod's directory is made at
// its creation.
func (pr *podRun) Prepare(context.Context) (bool, error) { return true, nil }

// Start implements podruntime.Runner: PreStartContainer, the environment
// (after it, as the kubelet generates it; after a restart of the node
// this waits until the node has read the pod from the API server again),
// then the process.
func (pr *podRun) Start(ctx context.Context, c *corev1.Container, attempt int32) (podruntime.Started, error) {
	if len(c.Command) == 0 {
		return podruntime.Started{}, &podruntime.WaitError{
			Reason:  podruntime.ReasonCreateContainerConfigError,
			Message: "the process backend runs the container's command on the host and does not pull images: set command (and args) for container " + c.Name,
		}
	}
	if pr.b.cfg.PreStart != nil {
		if err := pr.b.cfg.PreStart(ctx, pr.pod, c.Name); err != nil {
			return podruntime.Started{}, &podruntime.WaitError{Reason: podruntime.ReasonCreateContainerConfigError, Message: "PreStartContainer: " + err.Error()}
		}
	}
	env, vars, err := pr.containerEnv(ctx, pr.pod, *c)
	if err != nil {
		if ctx.Err() != nil {
			return podruntime.Started{}, ctx.Err()
		}
		return podruntime.Started{}, &podruntime.WaitError{Reason: podruntime.ReasonCreateContainerConfigError, Message: err.Error()}
	}
	p, err := pr.startProc(pr.pod, *c, attempt, env, vars)
	var cfgErr *configError
	if errors.As(err, &cfgErr) {
		return podruntime.Started{}, &podruntime.WaitError{Reason: podruntime.ReasonCreateContainerConfigError, Message: cfgErr.Error()}
	}
	if err != nil {
		return podruntime.Started{}, err
	}
	pr.mu.Lock()
	pr.procs[c.Name], pr.restarts[c.Name] = p, attempt
	pr.mu.Unlock()
	pr.follow(p)
	return podruntime.Started{ID: p.id()}, nil
}

// follow wakes the worker when p exits.
func (pr *podRun) follow(p *proc) {
	go func() {
		<-p.exited
		pr.w.Wake()
	}()
}

// byID returns the process that is run id, nil if none.
func (pr *podRun) byID(id string) *proc {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for _, p := range pr.procs {
		if p.id() == id {
			return p
		}
	}
	return nil
}

// Observe implements podruntime.Runner.
func (pr *podRun) Observe(_ context.Context, _ *corev1.Container, id string) (podruntime.Observed, error) {
	p := pr.byID(id)
	if p == nil {
		return podruntime.Observed{}, fmt.Errorf("process %s: %w", id, podruntime.ErrContainerGone)
	}
	if p.running() {
		return podruntime.Observed{Running: true, StartedAt: p.started.Time}, nil
	}
	reason := podruntime.ExitReason(p.code)
	if p.reason != "" {
		reason = p.reason
	}
	t := podruntime.Terminated(p.code, reason, "", p.started, p.finished).Terminated
	t.ContainerID = pr.ContainerID(id)
	return podruntime.Observed{Terminated: t}, nil
}

// Stop implements podruntime.Runner: SIGTERM to the process group, then
// SIGKILL once grace has passed.
func (pr *podRun) Stop(ctx context.Context, id string, grace int64) {
	p := pr.byID(id)
	if p == nil {
		return
	}
	if grace <= 0 {
		p.signal(syscall.SIGKILL)
	} else {
		p.signal(syscall.SIGTERM)
		timer := time.NewTimer(time.Duration(grace) * time.Second)
		defer timer.Stop()
		select {
		case <-p.exited:
			return
		case <-timer.C:
			p.signal(syscall.SIGKILL)
		case <-ctx.Done():
			return
		}
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
	}
}

// Remove implements podruntime.Runner: a dead process leaves only its
// log and exit files, which go with the pod.
func (pr *podRun) Remove(context.Context, string) {}

// ContainerID implements podruntime.Runner: process://<pid>.
func (pr *podRun) ContainerID(id string) string {
	pid, _, _ := strings.Cut(id, "/")
	return "process://" + pid
}

// PodIP implements podruntime.Runner: the pod is on the node's network.
func (pr *podRun) PodIP() string { return "" }

// Ended implements podruntime.Runner: nothing outlives the processes.
func (pr *podRun) Ended(context.Context) {}

// Teardown implements podruntime.Runner: the pod's directory goes when
// the pod is forgotten.
func (pr *podRun) Teardown(context.Context) {}

// Worker implements podruntime.WorkerRun.
func (pr *podRun) Worker() *podruntime.Worker { return pr.w }
