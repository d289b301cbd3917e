package draverify

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// healthWatch reads one health stream, in the health service negotiated
// at the registration, and records when each device was reported and
// the health timeout the driver gave it.
type healthWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	opened time.Time

	mu      sync.Mutex
	seen    map[string][]time.Time   // pool/device -> report times
	timeout map[string]time.Duration // pool/device -> its last health_check_timeout_seconds, when above 0
	err     error
}

func (h *healthWatch) stop() {
	h.cancel()
	<-h.done
}

func (r *run) watchHealth() *healthWatch {
	ctx, cancel := context.WithCancel(context.Background())
	h := &healthWatch{cancel: cancel, done: make(chan struct{}), seen: map[string][]time.Time{}, timeout: map[string]time.Duration{}, opened: time.Now()}
	go func() {
		defer close(h.done)
		stream, err := r.plugin.NodeWatchResources(ctx)
		for err == nil {
			var msg *drahealthv1.NodeWatchResourcesResponse
			if msg, err = stream.Recv(); err == nil {
				now := time.Now()
				h.mu.Lock()
				for _, d := range msg.Devices {
					k := d.GetDevice().GetPoolName() + "/" + d.GetDevice().GetDeviceName()
					h.seen[k] = append(h.seen[k], now)
					// The kubelet takes a device's timeout from each
					// report, its default when the field is not above 0
					// (pkg/kubelet/cm/dra/manager.go buildDeviceHealth).
					if s := d.GetHealthCheckTimeoutSeconds(); s > 0 {
						h.timeout[k] = time.Duration(s) * time.Second
					} else {
						delete(h.timeout, k)
					}
				}
				h.mu.Unlock()
			}
		}
		h.mu.Lock()
		h.err = err
		h.mu.Unlock()
	}()
	return h
}

// timeoutOf is how long the kubelet holds a report of device k: the
// driver's health_check_timeout_seconds, else --health-timeout (the
// kubelet's default); own says which.
func (r *run) timeoutOf(h *healthWatch, k string) (d time.Duration, own bool) {
	if t, ok := h.timeout[k]; ok {
		return t, true
	}
	return r.cfg.HealthTimeout, false
}

// healthSettled tells whether every device was reported twice or its
// window ended: twice its timeout after its first report, or after the
// stream opened for a device never reported. h.mu is held.
func (r *run) healthSettled(h *healthWatch, now time.Time) bool {
	for _, d := range r.devices {
		k := r.pool + "/" + d
		times := h.seen[k]
		t, _ := r.timeoutOf(h, k)
		switch {
		case len(times) >= 2:
		case len(times) == 1 && now.Before(times[0].Add(2*t)):
			return false
		case len(times) == 0 && now.Before(h.opened.Add(2*t)):
			return false
		}
	}
	return true
}

func (r *run) checkHealth(ctx context.Context) bool {
	if r.plugin.HealthService() == "" {
		r.set(verify.CheckDRAHealth, verify.Skip, "the driver's registration lists no DRAResourceHealth service: the kubelet does not watch its health")
		return true
	}
	h := r.watchHealth()
	r.health = h
	// Every device reported twice, the second time within its health
	// timeout. A report later than that is a time, judged a warning; only
	// none within twice the timeout fails.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		h.mu.Lock()
		settled := r.healthSettled(h, time.Now())
		h.mu.Unlock()
		if settled {
			break
		}
		select {
		case <-ctx.Done():
			return false
		case <-h.done:
			break wait
		case <-tick.C:
		}
	}
	h.stop()
	r.health = nil
	r.lastHealth = h // for dra.health.published-devices (healthdevices.go)
	h.mu.Lock()
	defer h.mu.Unlock()
	var never, once, late []string
	var gap time.Duration
	timeouts := map[string]bool{}
	for _, d := range r.devices {
		k := r.pool + "/" + d
		times := h.seen[k]
		t, own := r.timeoutOf(h, k)
		if own {
			timeouts[fmt.Sprintf("%s (the driver's health_check_timeout_seconds)", t)] = true
		} else {
			timeouts[fmt.Sprintf("%s (--health-timeout: the driver sends no health_check_timeout_seconds)", t)] = true
		}
		switch len(times) {
		case 0:
			never = append(never, d)
		case 1:
			once = append(once, fmt.Sprintf("%s (timeout %s)", d, t))
		default:
			var g time.Duration
			for i := 1; i < len(times); i++ {
				g = max(g, times[i].Sub(times[i-1]))
			}
			gap = max(gap, g)
			if g > t {
				late = append(late, fmt.Sprintf("%s after %s (timeout %s)", d, g.Round(time.Millisecond), t))
			}
		}
	}
	timeout := strings.Join(slices.Sorted(func(yield func(string) bool) {
		for t := range timeouts {
			if !yield(t) {
				return
			}
		}
	}), ", ")
	unimplemented := status.Code(h.err) == codes.Unimplemented
	switch {
	case unimplemented && len(never) == len(r.devices):
		// The kubeletplugin helper's opt-out (ErrHealthNotSupported):
		// the kubelet stops watching (pkg/kubelet/cm/dra/plugin/
		// dra_plugin_manager.go), as for a driver without the service.
		r.set(verify.CheckDRAHealth, verify.Skip, "the driver declines health reporting: NodeWatchResources (%s) answered Unimplemented (%s), and the kubelet stops watching", r.plugin.HealthService(), status.Convert(h.err).Message())
	case len(never) == len(r.devices) && h.err != nil && !errors.Is(h.err, context.Canceled) && status.Code(h.err) != codes.Canceled:
		r.set(verify.CheckDRAHealth, verify.Fail, "the health stream ended: %v", h.err)
	case len(never) > 0:
		r.set(verify.CheckDRAHealth, verify.Fail, "device(s) %s never reported on the health stream within twice the health timeout %s", strings.Join(never, ", "), timeout)
	case len(once) > 0:
		r.set(verify.CheckDRAHealth, verify.Fail, "device(s) %s reported once and not again within twice their health timeout: the kubelet shows them Unknown from one timeout after the report", strings.Join(once, ", "))
	case len(late) > 0:
		r.set(verify.CheckDRAHealth, verify.Warn, "device(s) reported again late, the kubelet showing them Unknown in between: %s", strings.Join(late, "; "))
	default:
		r.set(verify.CheckDRAHealth, verify.Pass, "%d device(s) reported, again within %s (timeout %s)", len(r.devices), gap.Round(time.Millisecond), timeout)
	}
	return true
}
