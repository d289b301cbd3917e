package podruntime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Lifecycle hooks, as the kubelet's (pkg/kubelet/lifecycle/handlers.go):
// postStart runs once the container started, and the container counts as
// running only once it returned; if it fails the container is killed.
// preStop runs before a container is stopped, within its grace period,
// and what it took is taken from that period. The runner runs them at
// those points; what a handler does and says is here.

// MinGracePeriod is the kubelet's floor, in seconds, on the grace period
// a stop gets (minimumGracePeriodInSeconds).
const MinGracePeriod = 2

// KillGrace is the grace period, in seconds, of a kill that is not the
// pod's deletion (the kubelet's setTerminationGracePeriod): the pod's
// deletion grace period when it is being deleted, else the probe's
// terminationGracePeriodSeconds for a probe's kill (probe nil for
// another), else the pod's.
func KillGrace(pod *corev1.Pod, probe *corev1.Probe) int64 {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return *pod.DeletionGracePeriodSeconds
	case pod.Spec.TerminationGracePeriodSeconds == nil:
		return MinGracePeriod
	case probe != nil && probe.TerminationGracePeriodSeconds != nil:
		return *probe.TerminationGracePeriodSeconds
	}
	return *pod.Spec.TerminationGracePeriodSeconds
}

// Hook is one lifecycle handler to run for a container of a pod.
type Hook struct {
	Pod       *corev1.Pod
	Container *corev1.Container
	Handler   *corev1.LifecycleHandler
	// ID is the runtime container the handler runs against.
	ID string
	// PodIP is where an HTTP handler without a host goes.
	PodIP string
	// Exec runs an exec handler's command.
	Exec ExecFunc
	// Event records an event about the container.
	Event func(eventType, reason, message string)
}

// Run runs the handler and returns the kubelet's message when it fails.
func (h Hook) Run(ctx context.Context) (string, error) {
	pod, name := PodName(h.Pod), h.Container.Name
	switch {
	case h.Handler.Exec != nil:
		cmd := h.Handler.Exec.Command
		out, code, err := h.Exec(ctx, h.ID, cmd, 0)
		if err == nil && code != 0 {
			err = fmt.Errorf("command '%s' exited with %d: %s", strings.Join(cmd, " "), code, out)
		}
		if err != nil {
			return fmt.Sprintf("Exec lifecycle hook (%v) for Container %q in Pod %q failed - error: %v, message: %q", cmd, name, pod, err, string(out)), err
		}
		return "", nil
	case h.Handler.HTTPGet != nil:
		if err := h.runHTTP(ctx); err != nil {
			return fmt.Sprintf("HTTP lifecycle hook (%s) for Container %q in Pod %q failed - error: %v", h.Handler.HTTPGet.Path, name, pod, err), err
		}
		return "", nil
	case h.Handler.Sleep != nil:
		t := time.NewTimer(time.Duration(h.Handler.Sleep.Seconds) * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
			return "", nil
		case <-ctx.Done():
			err := errors.New("container terminated before sleep hook finished")
			return fmt.Sprintf("Sleep lifecycle hook (%d) for Container %q in Pod %q failed - error: %v", h.Handler.Sleep.Seconds, name, pod, err), err
		}
	}
	err := fmt.Errorf("invalid handler: %v", h.Handler)
	return "Cannot run handler: " + err.Error(), err
}

// runHTTP is the kubelet's HTTP hook: a GET to the pod (kube-lifecycle
// User-Agent); only a failed request fails it, not the answer's status.
// An HTTPS request answered in plain HTTP is sent again in HTTP.
func (h Hook) runHTTP(ctx context.Context) error {
	get := h.Handler.HTTPGet
	if get.Host == "" && h.PodIP == "" {
		return errors.New("failed to find networking container: the pod has no IP")
	}
	req, err := NewHTTPRequest(ctx, get, h.Container, h.PodIP, "lifecycle")
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
			h.Event(corev1.EventTypeWarning, EventLifecycleHTTPFallback, fmt.Sprintf("request to HTTPS lifecycle hook %s got HTTP response, retry with HTTP succeeded", req.URL.Host))
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
