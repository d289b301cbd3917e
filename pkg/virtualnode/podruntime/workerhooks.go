package podruntime

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// A Worker's probes, lifecycle hooks and the killing of a container, as
// the kubelet's prober and kuberuntime startContainer and killContainer.

// probedLocked answers Probed for a running container.
func (w *Worker) probedLocked(name string) (started, ready bool) {
	for _, c := range w.ctrs {
		if c.spec.Name == name {
			return c.probes.Probed(&c.spec, c.id, w.readiness[name])
		}
	}
	return true, true
}

// startProbes starts a worker for every probe of the pod's containers and
// returns what stops them and waits for them.
func (w *Worker) startProbes(ctx context.Context) (stop func()) {
	byName := map[string]*container{}
	for _, c := range w.ctrs {
		byName[c.spec.Name] = c
	}
	readiness, stop := StartProbes(ctx, w.pod, func(spec *corev1.Container) ProbeTarget {
		return target{w, byName[spec.Name]}
	}, w.cfg.ProbeTicker)
	w.mu.Lock()
	w.readiness = readiness
	w.mu.Unlock()
	return stop
}

// target is a container of the pod as its probe workers and hooks see
// it.
type target struct {
	w *Worker
	c *container
}

// Inspect implements ProbeTarget; a result that changed wakes the worker,
// whose next status follows it.
func (t target) Inspect(f func(ProbeView, *ProbeResults)) {
	w, c := t.w, t.c
	w.mu.Lock()
	before := c.probes
	f(ProbeView{
		ID: c.id, Running: c.state.Running != nil, Exited: c.exited, PostStarting: c.postStarting,
		Stopping: w.stopping, StartedAt: c.started, PodIP: w.podIP(),
	}, &c.probes)
	changed := c.probes != before
	w.mu.Unlock()
	if changed {
		w.Wake()
	}
}

func (t target) Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	return t.w.rt.Exec(ctx, id, cmd, timeout)
}

func (t target) Event(eventType, reason, message string) {
	t.w.event(t.c, eventType, reason, message)
}

// Kill kills a run whose liveness or startup probe failed; the container
// restarts as its restart policy says.
func (t target) Kill(ctx context.Context, id string, kind ProbeKind, message string) {
	t.w.kill(ctx, t.c, id, message, KillGrace(t.w.pod, kind.Spec(&t.c.spec)))
}

// podIP is the address probes and hooks reach: the pod's, or the node's.
func (w *Worker) podIP() string {
	if ip := w.rt.PodIP(); ip != "" {
		return ip
	}
	return w.cfg.NodeIP
}

// event records an event about c.
func (w *Worker) event(c *container, eventType, reason, message string) {
	if w.cfg.Event != nil {
		w.cfg.Event(w.pod, c.spec.Name, eventType, reason, message)
	}
}

// runHandler runs a lifecycle handler against run id of c and returns
// the kubelet's message when it fails.
func (w *Worker) runHandler(ctx context.Context, c *container, id string, h *corev1.LifecycleHandler) (string, error) {
	t := target{w, c}
	return Hook{Pod: w.pod, Container: &c.spec, Handler: h, ID: id, PodIP: w.podIP(), Exec: t.Exec, Event: t.Event}.Run(ctx)
}

// postStart runs c's postStart hook, if any, on the run that just
// started. Until it returns the container is not running for its probes
// (nor in the status, published after it); if it fails the run is
// killed (event FailedPostStartHook) and the container restarts as its
// restart policy says. The pod's deletion (ctx) cancels it.
func (w *Worker) postStart(ctx context.Context, c *container) {
	if c.spec.Lifecycle == nil || c.spec.Lifecycle.PostStart == nil {
		return
	}
	w.mu.Lock()
	id := c.id
	c.postStarting = true
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		c.postStarting = false
		w.mu.Unlock()
	}()
	msg, err := w.runHandler(ctx, c, id, c.spec.Lifecycle.PostStart)
	if err == nil || ctx.Err() != nil {
		return
	}
	w.log.Warn("PostStart hook failed", "pod", w.key(), "container", c.spec.Name, "message", msg)
	// As the kubelet, the event does not carry the message, which may
	// hold secrets.
	w.event(c, corev1.EventTypeWarning, EventFailedPostStartHook, MessagePostStartHookFailed)
	w.kill(ctx, c, id, EventFailedPostStartHook, KillGrace(w.pod, nil))
}

// kill stops run id of c as the kubelet's killContainer: the Killing
// event (message, or "Stopping container <name>"), the preStop hook
// within the grace period, then the runner's Stop with what is left of
// it, MinGracePeriod at least. A grace period of 0 (the pod is
// forgotten) stops it at once, without the hook.
func (w *Worker) kill(ctx context.Context, c *container, id, message string, grace int64) {
	if message == "" {
		message = StoppingMessage(c.spec.Name)
	}
	w.event(c, corev1.EventTypeNormal, EventKilling, message)
	if grace > 0 {
		if c.spec.Lifecycle != nil && c.spec.Lifecycle.PreStop != nil {
			grace -= w.preStop(ctx, c, id, grace)
		}
		grace = max(grace, MinGracePeriod)
	}
	w.rt.Stop(ctx, id, grace)
	w.Wake()
}

// preStop runs c's preStop hook and waits for it the grace period at
// most; it returns the seconds it took. A hook that outlives the grace
// period is cancelled, without a FailedPreStopHook event.
func (w *Worker) preStop(ctx context.Context, c *container, id string, grace int64) int64 {
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, time.Duration(grace)*time.Second)
	defer cancel()
	if _, err := w.runHandler(hctx, c, id, c.spec.Lifecycle.PreStop); err != nil && hctx.Err() == nil {
		w.log.Warn("PreStop hook failed", "pod", w.key(), "container", c.spec.Name, "err", err)
		w.event(c, corev1.EventTypeWarning, EventFailedPreStopHook, MessagePreStopHookFailed)
	}
	return int64(time.Since(start).Seconds())
}
