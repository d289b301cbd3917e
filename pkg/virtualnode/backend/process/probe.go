package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Probes and lifecycle hooks, as the cri backend's: podruntime's probe
// workers and hooks, against the container's current process. Exec
// probes and hooks run as a process beside the container's (its user,
// environment and working directory), network probes and HTTP hooks
// reach the node's address (the pod is on the host's network).

// id names one run of a container for its probes: its process, which a
// restart replaces.
func (p *proc) id() string { return fmt.Sprintf("%d/%d", p.pid, p.startTicks) }

// probeResultsLocked is what container name's probes found.
func (pr *podRun) probeResultsLocked(name string) *podruntime.ProbeResults {
	r := pr.probes[name]
	if r == nil {
		r = &podruntime.ProbeResults{}
		pr.probes[name] = r
	}
	return r
}

// probedLocked answers podruntime.Probed for a running container.
func (pr *podRun) probedLocked(name string) (started, ready bool) {
	spec, p := podspec.Container(pr.pod, name), pr.procs[name]
	if spec == nil || p == nil {
		return true, true
	}
	return pr.probeResultsLocked(name).Probed(spec, p.id(), pr.readiness[name])
}

// startProbes starts a worker for every probe of the pod's containers and
// returns what stops them and waits for them.
func (pr *podRun) startProbes(ctx context.Context, pod *corev1.Pod) (stop func()) {
	readiness, stop := podruntime.StartProbes(ctx, pod, func(c *corev1.Container) podruntime.ProbeTarget {
		return procTarget{pr, c}
	}, pr.b.cfg.probeTicker)
	pr.mu.Lock()
	pr.readiness = readiness
	pr.mu.Unlock()
	return stop
}

// procTarget is a container of the pod as its probe workers and hooks
// see it.
type procTarget struct {
	pr   *podRun
	spec *corev1.Container
}

// Inspect implements podruntime.ProbeTarget; a result that changed is
// published (the status's started and ready follow it).
func (t procTarget) Inspect(f func(podruntime.ProbeView, *podruntime.ProbeResults)) {
	pr, name := t.pr, t.spec.Name
	pr.mu.Lock()
	v := podruntime.ProbeView{Stopping: pr.isStopping(), PodIP: pr.b.cfg.NodeIP, PostStarting: pr.postStarting[name]}
	if p := pr.procs[name]; p != nil {
		v.ID, v.Running, v.StartedAt = p.id(), p.running(), p.started.Time
		v.Exited = !v.Running
	}
	r := pr.probeResultsLocked(name)
	before := *r
	f(v, r)
	changed := *r != before
	pr.mu.Unlock()
	if changed {
		pr.publish()
	}
}

func (t procTarget) Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	return t.pr.execSync(ctx, t.spec.Name, id, cmd, timeout)
}

func (t procTarget) Event(eventType, reason, message string) {
	if ev := t.pr.b.cfg.Event; ev != nil {
		ev(t.pr.Snapshot(), t.spec.Name, eventType, reason, message)
	}
}

// Kill stops the process id of a container whose liveness or startup
// probe failed; it restarts as its restart policy says.
func (t procTarget) Kill(ctx context.Context, id string, kind podruntime.ProbeKind, message string) {
	t.pr.killProc(ctx, t.spec, id, message, podruntime.KillGrace(t.pr.Snapshot(), kind.Spec(t.spec)))
}

// current returns container name's process when it is run id.
func (pr *podRun) current(name, id string) *proc {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if p := pr.procs[name]; p != nil && p.id() == id {
		return p
	}
	return nil
}

// killProc stops run id of container spec as the kubelet's
// killContainer: the Killing event, the preStop hook within the grace
// period, SIGTERM, then SIGKILL once what is left of it (2s at least)
// has passed.
func (pr *podRun) killProc(ctx context.Context, spec *corev1.Container, id, message string, grace int64) {
	p := pr.current(spec.Name, id)
	if p == nil {
		return
	}
	if message == "" {
		message = podruntime.StoppingMessage(spec.Name)
	}
	t := procTarget{pr, spec}
	t.Event(corev1.EventTypeNormal, podruntime.EventKilling, message)
	if spec.Lifecycle != nil && spec.Lifecycle.PreStop != nil {
		grace -= pr.preStop(ctx, spec, id, grace)
	}
	grace = max(grace, podruntime.MinGracePeriod)
	p.signal(syscall.SIGTERM)
	timer := time.NewTimer(time.Duration(grace) * time.Second)
	defer timer.Stop()
	select {
	case <-p.exited:
	case <-timer.C:
		p.signal(syscall.SIGKILL)
	case <-ctx.Done():
	}
}

// hook runs one of container spec's lifecycle handlers against run id.
func (pr *podRun) hook(ctx context.Context, spec *corev1.Container, id string, h *corev1.LifecycleHandler) (string, error) {
	t := procTarget{pr, spec}
	return podruntime.Hook{
		Pod: pr.Snapshot(), Container: spec, Handler: h, ID: id, PodIP: pr.b.cfg.NodeIP,
		Exec: t.Exec, Event: t.Event,
	}.Run(ctx)
}

// postStart runs spec's postStart hook, if any, on run id that just
// started. Until it returns the container is not running for its probes;
// if it fails the container is killed (event FailedPostStartHook) and
// restarts as its restart policy says. The pod's deletion or the
// process's exit cancels it.
func (pr *podRun) postStart(ctx context.Context, spec *corev1.Container, p *proc) {
	if spec.Lifecycle == nil || spec.Lifecycle.PostStart == nil {
		return
	}
	pr.mu.Lock()
	pr.postStarting[spec.Name] = true
	pr.mu.Unlock()
	defer func() {
		pr.mu.Lock()
		delete(pr.postStarting, spec.Name)
		pr.mu.Unlock()
	}()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-pr.stopping:
		case <-p.exited:
		case <-hctx.Done():
		}
		cancel()
	}()
	msg, err := pr.hook(hctx, spec, p.id(), spec.Lifecycle.PostStart)
	if err == nil {
		return
	}
	pr.b.log.Warn("PostStart hook failed", "pod", pr.key(), "container", spec.Name, "message", msg)
	// As the kubelet, the event does not carry the message, which may
	// hold secrets.
	t := procTarget{pr, spec}
	t.Event(corev1.EventTypeWarning, podruntime.EventFailedPostStartHook, podruntime.MessagePostStartHookFailed)
	pr.killProc(ctx, spec, p.id(), podruntime.EventFailedPostStartHook, podruntime.KillGrace(pr.Snapshot(), nil))
}

// preStop runs spec's preStop hook against run id and waits for it the
// grace period at most; it returns the seconds it took. A hook that
// outlives the grace period is cancelled, without a FailedPreStopHook
// event.
func (pr *podRun) preStop(ctx context.Context, spec *corev1.Container, id string, grace int64) int64 {
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, time.Duration(grace)*time.Second)
	defer cancel()
	if _, err := pr.hook(hctx, spec, id, spec.Lifecycle.PreStop); err != nil && hctx.Err() == nil {
		pr.b.log.Warn("PreStop hook failed", "pod", pr.key(), "container", spec.Name, "err", err)
		procTarget{pr, spec}.Event(corev1.EventTypeWarning, podruntime.EventFailedPreStopHook, podruntime.MessagePreStopHookFailed)
	}
	return int64(time.Since(start).Seconds())
}

func (pr *podRun) key() string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.pod.Namespace + "/" + pr.pod.Name
}

// execSync runs cmd beside run id of container name, as the container's
// user with its environment and working directory, and returns its
// output (stdout, then stderr, the first podruntime.MaxExecOutput bytes)
// and exit code. Past timeout (when not 0) the command's process group is
// killed and the error wraps podruntime.ErrExecTimedOut.
func (pr *podRun) execSync(ctx context.Context, name, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	if pr.current(name, id) == nil {
		return nil, 0, fmt.Errorf("container %s: %w: its process %s is gone", name, ErrNotFound, id)
	}
	cctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	c, err := pr.command(cctx, name, cmd)
	if err != nil {
		return nil, 0, err
	}
	out := &limitedBuffer{max: podruntime.MaxExecOutput}
	c.Stdout, c.Stderr = out, out
	err = c.Run()
	var ee *exec.ExitError
	switch {
	case timeout > 0 && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded):
		return out.Bytes(), 0, fmt.Errorf("%w: %q timed out after %s", podruntime.ErrExecTimedOut, strings.Join(cmd, " "), timeout)
	case errors.As(err, &ee):
		return out.Bytes(), int32(ee.ExitCode()), nil //nolint:gosec // an exit code
	case err != nil:
		return nil, 0, err
	}
	return out.Bytes(), 0, nil
}

// limitedBuffer keeps the first max bytes written to it and drops the
// rest.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
