package cri

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Lifecycle hooks and the killing of a container, as the kubelet's
// (pkg/kubelet/lifecycle/handlers.go, kuberuntime startContainer and
// killContainer): postStart runs once the container started, and the
// container counts as running only once it returned; if it fails the
// container is killed. preStop runs before a container is stopped, within
// its grace period, and what it took is taken from that period.

// minGracePeriod is the kubelet's floor on the grace period a stop gets
// (minimumGracePeriodInSeconds).
const minGracePeriod = 2

// runHandler runs a lifecycle handler against the container id and
// returns the kubelet's message when it fails.
func (pr *podRun) runHandler(ctx context.Context, c *ctr, id string, h *corev1.LifecycleHandler) (string, error) {
	switch {
	case h.Exec != nil:
		out, code, err := pr.execSync(ctx, id, h.Exec.Command, 0)
		if err == nil && code != 0 {
			err = fmt.Errorf("command '%s' exited with %d: %s", strings.Join(h.Exec.Command, " "), code, out)
		}
		if err != nil {
			return fmt.Sprintf("Exec lifecycle hook (%v) for Container %q in Pod %q failed - error: %v, message: %q", h.Exec.Command, c.spec.Name, formatPod(pr.pod), err, string(out)), err
		}
		return "", nil
	case h.HTTPGet != nil:
		if err := pr.runHTTPHandler(ctx, c, h.HTTPGet); err != nil {
			return fmt.Sprintf("HTTP lifecycle hook (%s) for Container %q in Pod %q failed - error: %v", h.HTTPGet.Path, c.spec.Name, formatPod(pr.pod), err), err
		}
		return "", nil
	case h.Sleep != nil:
		t := time.NewTimer(time.Duration(h.Sleep.Seconds) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
			return "", nil
		case <-ctx.Done():
			err := errors.New("container terminated before sleep hook finished")
			return fmt.Sprintf("Sleep lifecycle hook (%d) for Container %q in Pod %q failed - error: %v", h.Sleep.Seconds, c.spec.Name, formatPod(pr.pod), err), err
		}
	}
	err := fmt.Errorf("invalid handler: %v", h)
	return "Cannot run handler: " + err.Error(), err
}

// runHTTPHandler is the kubelet's HTTP hook: a GET to the pod (kube-
// lifecycle User-Agent); only a failed request fails it, not the answer's
// status. An HTTPS request answered in plain HTTP is sent again in HTTP.
func (pr *podRun) runHTTPHandler(ctx context.Context, c *ctr, h *corev1.HTTPGetAction) error {
	pr.mu.Lock()
	podIP := pr.statusIPLocked()
	pr.mu.Unlock()
	if h.Host == "" && podIP == "" {
		return errors.New("failed to find networking container: the pod has no IP")
	}
	req, err := newHTTPRequest(ctx, h, &c.spec, podIP, "lifecycle")
	if err != nil {
		return err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, Proxy: http.ProxyURL(nil)} //nolint:gosec // as the kubelet's hooks
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	resp, err := client.Do(req)
	discard(resp)
	if err != nil && strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		req = req.Clone(ctx)
		req.URL.Scheme = "http"
		req.Header.Del("Authorization")
		resp, herr := client.Do(req)
		discard(resp)
		if herr == nil {
			pr.event(c, corev1.EventTypeWarning, "LifecycleHTTPFallback", fmt.Sprintf("request to HTTPS lifecycle hook %s got HTTP response, retry with HTTP succeeded", req.URL.Host))
			err = nil
		}
	}
	return err
}

func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	_ = resp.Body.Close()
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
	pr.killContainer(ctx, c, id, podruntime.EventFailedPostStartHook, pr.killGrace(nil))
}

// killGrace is the grace period of a kill that is not the pod's deletion
// (kubelet setTerminationGracePeriod): the pod's deletion grace period
// when it is being deleted, else the probe's terminationGracePeriodSeconds
// for a probe's kill, else the pod's.
func (pr *podRun) killGrace(probe *corev1.Probe) int64 {
	switch {
	case pr.pod.DeletionGracePeriodSeconds != nil:
		return *pr.pod.DeletionGracePeriodSeconds
	case pr.pod.Spec.TerminationGracePeriodSeconds == nil:
		return minGracePeriod
	case probe != nil && probe.TerminationGracePeriodSeconds != nil:
		return *probe.TerminationGracePeriodSeconds
	}
	return *pr.pod.Spec.TerminationGracePeriodSeconds
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
		grace = max(grace, minGracePeriod)
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
