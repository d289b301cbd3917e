package cri

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	remote "k8s.io/cri-client/pkg"
	utilexec "k8s.io/utils/exec"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Container probes: podruntime's probe workers, one per probe of a
// container for the pod's life, each following the runtime container
// that currently runs it through a probeTarget; the exec probe runs
// through the runtime's ExecSync.

// runtimeRequestTimeout is the kubelet's default --runtime-request-timeout,
// which bounds each call to the runtime, an exec beyond its own timeout.
const runtimeRequestTimeout = 2 * time.Minute

// probeState is what a container's probes found for its current runtime
// container; guarded by the pod's mutex.
type probeState struct {
	podruntime.ProbeResults
	// postStarting: its postStart hook runs, and the container does not
	// count as running for its probes yet (the kubelet reports it running
	// only once the hook returned).
	postStarting bool
}

// startedLocked reports whether c's current container started: it runs
// and its startup probe, if any, passed.
func (c *ctr) startedLocked() bool { return c.probe.Started(&c.spec, c.id) }

// started is startedLocked for the pod's run loop.
func (pr *podRun) started(c *ctr) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return c.startedLocked()
}

// probedLocked answers podruntime.Probed for a running container.
func (pr *podRun) probedLocked(name string) (started, ready bool) {
	for _, c := range pr.ctrs {
		if c.spec.Name == name {
			return c.probe.Probed(&c.spec, c.id, pr.readiness[name])
		}
	}
	return true, true
}

// startProbes starts a worker for every probe of the pod's containers and
// returns what stops them and waits for them.
func (pr *podRun) startProbes(ctx context.Context) (stop func()) {
	byName := map[string]*ctr{}
	for _, c := range pr.ctrs {
		byName[c.spec.Name] = c
	}
	readiness, stop := podruntime.StartProbes(ctx, pr.pod, func(spec *corev1.Container) podruntime.ProbeTarget {
		return probeTarget{pr, byName[spec.Name]}
	}, pr.b.cfg.probeTicker)
	pr.mu.Lock()
	pr.readiness = readiness
	pr.mu.Unlock()
	return stop
}

// probeTarget is a container of the pod as its probe workers see it.
type probeTarget struct {
	pr *podRun
	c  *ctr
}

func (t probeTarget) Inspect(f func(podruntime.ProbeView, *podruntime.ProbeResults)) {
	pr, c := t.pr, t.c
	pr.mu.Lock()
	defer pr.mu.Unlock()
	f(podruntime.ProbeView{
		ID: c.id, Running: c.state.Running != nil, Exited: c.exited, PostStarting: c.probe.postStarting,
		Stopping: pr.stopping, StartedAt: c.started, PodIP: pr.statusIPLocked(),
	}, &c.probe.ProbeResults)
}

func (t probeTarget) Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	return t.pr.execSync(ctx, id, cmd, timeout)
}

func (t probeTarget) Event(eventType, reason, message string) {
	t.pr.event(t.c, eventType, reason, message)
}

// Kill kills a container whose liveness or startup probe failed; it
// restarts as its restart policy says.
func (t probeTarget) Kill(ctx context.Context, id string, kind podruntime.ProbeKind, message string) {
	t.pr.killContainer(ctx, t.c, id, message, podruntime.KillGrace(t.pr.pod, kind.Spec(&t.c.spec)))
}

// statusIPLocked is the pod's IP as its status reports it: the sandbox's,
// or the node's for a pod on the host's network.
func (pr *podRun) statusIPLocked() string {
	if pr.podIP != "" {
		return pr.podIP
	}
	return pr.b.cfg.NodeIP
}

// event records an event about c.
func (pr *podRun) event(c *ctr, eventType, reason, message string) {
	if pr.b.cfg.Event != nil {
		pr.b.cfg.Event(pr.pod, c.spec.Name, eventType, reason, message)
	}
}

// execSync runs cmd in the container through the runtime's ExecSync and
// returns its output (stdout, then stderr) and exit code. timeout 0 runs
// it until ctx ends; else the call is bounded by timeout and the
// RequestTimeout beyond it, and an exec past it is an error wrapping
// remote.ErrCommandTimedOut and podruntime.ErrExecTimedOut, as the
// kubelet's.
func (pr *podRun) execSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	stdout, stderr, err := pr.b.rt.ExecSync(pr.b.logctx(ctx), id, cmd, timeout)
	var exit utilexec.CodeExitError
	switch {
	case errors.As(err, &exit):
		return append(stdout, stderr...), int32(exit.Code), nil //nolint:gosec // the runtime's int32
	case errors.Is(err, remote.ErrCommandTimedOut):
		return nil, 0, execTimeout{err}
	case err != nil:
		return nil, 0, err
	}
	return append(stdout, stderr...), 0, nil
}

// execTimeout is the runtime's timeout error, also podruntime's.
type execTimeout struct{ error }

func (e execTimeout) Unwrap() []error { return []error{e.error, podruntime.ErrExecTimedOut} }
