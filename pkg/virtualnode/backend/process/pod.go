package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// podRun runs one pod: init containers in order, then app containers, each
// restarted according to the pod's restartPolicy.
type podRun struct {
	b   *Backend
	dir string

	mu       sync.Mutex
	pod      *corev1.Pod
	procs    map[string]*proc     // running or last process per container
	adopt    map[string]procState // processes of a previous run, until followed
	restarts map[string]int32
	// probes are what each container's probes found, readiness its
	// readiness probe's worker, postStarting whether its postStart hook
	// runs (probe.go).
	probes       map[string]*podruntime.ProbeResults
	readiness    map[string]*podruntime.ProbeWorker
	postStarting map[string]bool
	stopping     chan struct{} // closed by stop
	stopOnce     sync.Once
	killAt       time.Time
	done         chan struct{}
	loopsWG      sync.WaitGroup // container loops
}

func newPodRun(b *Backend, pod *corev1.Pod) *podRun {
	pr := &podRun{
		b:            b,
		dir:          filepath.Join(b.cfg.Dir, string(pod.UID)),
		pod:          pod,
		procs:        map[string]*proc{},
		adopt:        map[string]procState{},
		restarts:     map[string]int32{},
		probes:       map[string]*podruntime.ProbeResults{},
		stopping:     make(chan struct{}),
		postStarting: map[string]bool{},
		done:         make(chan struct{}),
	}
	for _, s := range pod.Status.InitContainerStatuses {
		pr.restarts[s.Name] = s.RestartCount
	}
	for _, s := range pod.Status.ContainerStatuses {
		pr.restarts[s.Name] = s.RestartCount
	}
	return pr
}

// Pod implements podruntime.Run.
func (pr *podRun) Pod() *corev1.Pod { return pr.pod }

// Snapshot implements podruntime.Run.
func (pr *podRun) Snapshot() *corev1.Pod {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.pod.DeepCopy()
}

// untilStopped returns a context that ends with ctx, when the pod is
// stopped or when cancel is called.
func (pr *podRun) untilStopped(ctx context.Context) (_ context.Context, cancel context.CancelFunc) {
	ctx, cancel = context.WithCancel(ctx)
	go func() {
		defer cancel()
		select {
		case <-pr.stopping:
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func (pr *podRun) isStopping() bool {
	select {
	case <-pr.stopping:
		return true
	default:
		return false
	}
}

// stop terminates the pod: SIGTERM to every process group now (after its
// preStop hook, for a container with one, the first time), SIGKILL once
// grace has passed. Containers are not restarted after stop.
func (pr *podRun) stop(grace time.Duration) {
	pr.mu.Lock()
	at := time.Now().Add(grace)
	if pr.killAt.IsZero() || at.Before(pr.killAt) {
		pr.killAt = at
	}
	procs := make(map[string]*proc, len(pr.procs))
	for name, p := range pr.procs {
		procs[name] = p
	}
	pod := pr.pod.DeepCopy()
	pr.mu.Unlock()
	first := false
	pr.stopOnce.Do(func() { close(pr.stopping); first = true })
	for name, p := range procs {
		spec := podspec.Container(pod, name)
		switch {
		case grace <= 0:
			p.signal(syscall.SIGKILL)
		case first && spec != nil && spec.Lifecycle != nil && spec.Lifecycle.PreStop != nil && p.running():
			// As the kubelet: the preStop hook first, within the grace
			// period, then SIGTERM (the SIGKILL below comes at its end).
			go func() {
				pr.preStop(context.Background(), spec, p.id(), int64(grace/time.Second))
				p.signal(syscall.SIGTERM)
			}()
		default:
			p.signal(syscall.SIGTERM)
		}
	}
	if grace > 0 {
		time.AfterFunc(grace, func() {
			pr.mu.Lock()
			procs := make([]*proc, 0, len(pr.procs))
			for _, p := range pr.procs {
				procs = append(procs, p)
			}
			pr.mu.Unlock()
			for _, p := range procs {
				p.signal(syscall.SIGKILL)
			}
		})
	}
	// A pod whose run loop has already finished reports its final state
	// again so that the caller sees a terminal status.
	select {
	case <-pr.done:
		pr.publish()
	default:
	}
}

// publish recomputes the pod status, persists the state and notifies.
func (pr *podRun) publish() {
	pr.mu.Lock()
	podruntime.ComputeProbedStatus(pr.pod, &pr.pod.Status, pr.b.cfg.NodeIP, pr.isStopping(), pr.probedLocked)
	st := state{Pod: pr.pod, Procs: map[string]procState{}}
	for name, p := range pr.procs {
		st.Procs[name] = procState{PID: p.pid, StartTicks: p.startTicks, RestartCount: pr.restarts[name]}
	}
	data, err := json.Marshal(&st)
	out := pr.pod.DeepCopy()
	pr.mu.Unlock()
	if err == nil {
		err = writeAtomic(filepath.Join(pr.dir, "state.json"), data)
	}
	if err != nil {
		pr.b.log.Error("Persisting pod state", "pod", out.Namespace+"/"+out.Name, "err", err)
	}
	pr.b.cfg.Notify(out)
}

// stateFileMode is the mode of state.json: only the node's user reads
// what it knows of a pod.
const stateFileMode = 0o600

// writeAtomic replaces path with data, readable by its owner only.
func writeAtomic(path string, data []byte) error {
	return fileutil.WriteAtomic(path, data, stateFileMode)
}

// setState updates one container's status.
func (pr *podRun) setState(name string, init bool, f func(*corev1.ContainerStatus)) {
	pr.mu.Lock()
	list := pr.pod.Status.ContainerStatuses
	if init {
		list = pr.pod.Status.InitContainerStatuses
	}
	for i := range list {
		if list[i].Name == name {
			f(&list[i])
		}
	}
	pr.mu.Unlock()
	pr.publish()
}

func (pr *podRun) containerStatus(name string, init bool) corev1.ContainerStatus {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	list := pr.pod.Status.ContainerStatuses
	if init {
		list = pr.pod.Status.InitContainerStatuses
	}
	for _, s := range list {
		if s.Name == name {
			return *s.DeepCopy()
		}
	}
	return corev1.ContainerStatus{Name: name}
}

func (pr *podRun) run(ctx context.Context) {
	defer close(pr.done)
	pod := pr.Snapshot()
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	defer pr.startProbes(ctx, pod)()
	for i, c := range pod.Spec.InitContainers {
		if podspec.IsSidecar(&c) {
			// A sidecar: started and kept running alongside the app
			// containers.
			pr.startLoop(ctx, c, true)
			continue
		}
		if st := pr.containerStatus(c.Name, true); st.State.Terminated != nil && st.State.Terminated.ExitCode == 0 {
			continue
		}
		ok := pr.loop(ctx, pod.Spec.InitContainers[i], true)
		if ctx.Err() != nil {
			return
		}
		if !ok {
			pr.publish()
			pr.wait()
			return
		}
	}
	for _, c := range pod.Spec.Containers {
		pr.startLoop(ctx, c, false)
	}
	pr.wait()
	if ctx.Err() == nil {
		pr.publish()
	}
}

// wait blocks until every container loop of the pod has returned. The
// loops end promptly when ctx is done (the backend is closing) but may
// still be recording a container's exit under the pod's directory, so
// this waits for them even then: Close returns only once nothing writes
// there any more.
func (pr *podRun) wait() {
	pr.loopsWG.Wait()
}

func (pr *podRun) startLoop(ctx context.Context, c corev1.Container, init bool) {
	pr.loopsWG.Add(1)
	go func() {
		defer pr.loopsWG.Done()
		pr.loop(ctx, c, init)
	}()
}

// loop runs a container until it must not be restarted; it reports
// whether its last run succeeded.
func (pr *podRun) loop(ctx context.Context, c corev1.Container, init bool) bool {
	backoff := podruntime.Backoff{Initial: pr.b.cfg.BackoffInitial, Max: pr.b.cfg.BackoffMax}
	for {
		code, ok := pr.runOnce(ctx, c, init)
		if !ok || ctx.Err() != nil {
			return false
		}
		if pr.isStopping() {
			return code == 0
		}
		if !podruntime.ShouldRestart(pr.pod, &c, init, code) {
			return code == 0
		}
		pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
			s.LastTerminationState = s.State
			s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
				Reason:  podruntime.ReasonCrashLoopBackOff,
				Message: podruntime.CrashLoopBackOffMessage(backoff.Delay(), pr.pod, c.Name),
			}}
		})
		t := time.NewTimer(backoff.Delay())
		select {
		case <-t.C:
		case <-pr.stopping:
			t.Stop()
			pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
				if s.LastTerminationState.Terminated != nil {
					s.State = s.LastTerminationState
				}
			})
			return false
		case <-ctx.Done():
			t.Stop()
			return false
		}
		backoff.Step()
		pr.mu.Lock()
		pr.restarts[c.Name]++
		n := pr.restarts[c.Name]
		pr.mu.Unlock()
		pr.setState(c.Name, init, func(s *corev1.ContainerStatus) { s.RestartCount = n })
	}
}

// runOnce starts the container (or follows the process a previous run
// started) and waits for it to exit. ok is false when the container could
// not be created and must not be retried, or when the backend is closing.
func (pr *podRun) runOnce(ctx context.Context, c corev1.Container, init bool) (code int32, ok bool) {
	if pr.isStopping() {
		return 0, false
	}
	pr.mu.Lock()
	adopted, hasAdopted := pr.adopt[c.Name]
	delete(pr.adopt, c.Name)
	pod := pr.pod.DeepCopy()
	restart := pr.restarts[c.Name]
	pr.mu.Unlock()

	var p *proc
	prev := pr.containerStatus(c.Name, init)
	if hasAdopted && adopted.RestartCount == restart && prev.State.Running != nil {
		p = pr.adoptProc(c.Name, adopted)
		if p == nil {
			// Gone while we were away: report what its exit file says.
			code, reason := readExit(pr.exitFile(c.Name, restart))
			pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
				s.State = podruntime.Terminated(code, reason, "", prev.State.Running.StartedAt, podruntime.Now())
				s.State.Terminated.ContainerID = s.ContainerID
			})
			return code, true
		}
	} else if prev.State.Terminated != nil && hasAdopted && adopted.RestartCount == restart {
		return prev.State.Terminated.ExitCode, true
	}
	if p == nil {
		if len(c.Command) == 0 {
			pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
					Reason:  podruntime.ReasonCreateContainerConfigError,
					Message: "the process backend runs the container's command on the host and does not pull images: set command (and args) for container " + c.Name,
				}}
			})
			return 0, false
		}
		if pr.b.cfg.PreStart != nil {
			if err := pr.b.cfg.PreStart(ctx, pod, c.Name); err != nil {
				now := podruntime.Now()
				pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
					s.State = podruntime.Terminated(128, podruntime.ReasonStartError, err.Error(), now, now)
				})
				return 128, true
			}
		}
		// The environment after PreStartContainer, as the kubelet
		// generates it: after a restart of the node this waits until the
		// node has read the pod from the API server again.
		ectx, cancel := pr.untilStopped(ctx)
		env, vars, err := pr.containerEnv(ectx, pod, c)
		cancel()
		if err != nil {
			if ctx.Err() != nil || pr.isStopping() {
				return 0, false
			}
			now := podruntime.Now()
			pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
				s.State = podruntime.Terminated(128, podruntime.ReasonStartError, err.Error(), now, now)
			})
			return 128, true
		}
		p, err = pr.startProc(pod, c, restart, env, vars)
		var cfgErr *configError
		if errors.As(err, &cfgErr) {
			pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
				s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: podruntime.ReasonCreateContainerConfigError, Message: cfgErr.Error()}}
			})
			pr.b.log.Error("Container not started", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "err", cfgErr)
			return 0, false
		}
		if err != nil {
			now := podruntime.Now()
			pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
				s.State = podruntime.Terminated(128, podruntime.ReasonStartError, err.Error(), now, now)
			})
			return 128, true
		}
	}
	pr.mu.Lock()
	pr.procs[c.Name] = p
	pr.mu.Unlock()
	// As the kubelet, whose pod worker reports the container running
	// from its next sync, once the postStart hook has returned.
	pr.postStart(ctx, &c, p)
	started := p.started
	pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
		s.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
		s.ContainerID = fmt.Sprintf("process://%d", p.pid)
	})
	if pr.isStopping() {
		// stop raced with the start: make sure this process gets it too.
		pr.mu.Lock()
		killAt := pr.killAt
		pr.mu.Unlock()
		if time.Until(killAt) <= 0 {
			p.signal(syscall.SIGKILL)
		} else {
			p.signal(syscall.SIGTERM)
		}
	}
	select {
	case <-p.exited:
	case <-ctx.Done():
		return 0, false
	}
	reason := podruntime.ExitReason(p.code)
	if p.reason != "" {
		reason = p.reason
	}
	pr.setState(c.Name, init, func(s *corev1.ContainerStatus) {
		s.State = podruntime.Terminated(p.code, reason, "", started, p.finished)
		// The kubelet names the container in its terminated state too.
		s.State.Terminated.ContainerID = s.ContainerID
	})
	return p.code, true
}
