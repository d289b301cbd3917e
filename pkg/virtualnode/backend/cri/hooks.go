package cri

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Lifecycle hooks and the killing of a container, as the kubelet's
// kuberuntime startContainer and killContainer: podruntime.Hook runs the
// handlers, this file runs them at their points.

// runHandler runs a lifecycle handler against the container id and
// returns the kubelet's message when it fails.
func (pr *podRun) runHandler(ctx context.Context, c *ctr, id string, h *corev1.LifecycleHandler) (string, error) {
	pr.mu.Lock()
	podIP := pr.statusIPLocked()
	pr.mu.Unlock()
	t := probeTarget{pr, c}
	return podruntime.Hook{Pod: pr.pod, Container: &c.spec, Handler: h, ID: id, PodIP: podIP, Exec: t.Exec, Event: t.Event}.Run(ctx)
}

// postStart runs c's postStart hook, if any, on the container that just
// started. Until it returns the container is not running for its probes;
// if it fails the container is killed (event FailedPostStartHook) and
// restarts as its restart policy says. Deleting the pod cancels it.
func (pr *podRun) postStart(ctx context.Context, c *ctr) {
	if c.spec.Lifecycle == nil || c.spec.Lifecycle.PostStart == nil {
		return
	}
	pr.mu.Lock()
	id := c.id
	c.probe.postStarting = true
	pr.mu.Unlock()
	defer func() {
		pr.mu.Lock()
		c.probe.postStarting = false
		pr.mu.Unlock()
	}()
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-pr.stopCh:
			cancel()
		case <-hctx.Done():
		}
	}()
	msg, err := pr.runHandler(hctx, c, id, c.spec.Lifecycle.PostStart)
	if err == nil {
		return
	}
	pr.b.log.Warn("PostStart hook failed", "pod", pr.key(), "container", c.spec.Name, "message", msg)
	// As the kubelet, the event does not carry the message, which may
	// hold secrets.
	pr.event(c, corev1.EventTypeWarning, podruntime.EventFailedPostStartHook, podruntime.MessagePostStartHookFailed)
	pr.killContainer(ctx, c, id, podruntime.EventFailedPostStartHook, podruntime.KillGrace(pr.pod, nil))
}

// killContainer stops the container id of c as the kubelet's
// killContainer: the Killing event (message, or "Stopping container
// <name>"), the preStop hook within the grace period, then StopContainer
// with what is left of it, 2s at least. A grace period of 0 (the pod is
// forgotten) stops it at once, without the hook.
func (pr *podRun) killContainer(ctx context.Context, c *ctr, id, message string, grace int64) {
	if message == "" {
		message = podruntime.StoppingMessage(c.spec.Name)
	}
	pr.event(c, corev1.EventTypeNormal, podruntime.EventKilling, message)
	if grace > 0 {
		if c.spec.Lifecycle != nil && c.spec.Lifecycle.PreStop != nil {
			grace -= pr.preStop(ctx, c, id, grace)
		}
		grace = max(grace, podruntime.MinGracePeriod)
	}
	err := pr.b.rt.StopContainer(pr.b.logctx(ctx), id, grace)
	if err != nil && status.Code(err) != codes.NotFound {
		pr.b.log.Warn("Stopping a container", "pod", pr.key(), "container", c.spec.Name, "err", err)
	}
}

// preStop runs c's preStop hook and waits for it the grace period at
// most; it returns the seconds it took. A hook that outlives the grace
// period is cancelled, without a FailedPreStopHook event.
func (pr *podRun) preStop(ctx context.Context, c *ctr, id string, grace int64) int64 {
	start := time.Now()
	hctx, cancel := context.WithTimeout(ctx, time.Duration(grace)*time.Second)
	defer cancel()
	if _, err := pr.runHandler(hctx, c, id, c.spec.Lifecycle.PreStop); err != nil && hctx.Err() == nil {
		pr.b.log.Warn("PreStop hook failed", "pod", pr.key(), "container", c.spec.Name, "err", err)
		pr.event(c, corev1.EventTypeWarning, podruntime.EventFailedPreStopHook, podruntime.MessagePreStopHookFailed)
	}
	return int64(time.Since(start).Seconds())
}
