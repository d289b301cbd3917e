package verify

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// The checks of kubelet restarts and of the plugin's socket going away
// (restart.*).

// checkRestarts deletes the plugin's socket, then restarts the emulated
// kubelet Restarts times, measuring how long re-registration takes and
// counting registrations.
func (r *runner) checkRestarts(ctx context.Context) {
	// Wait past the threshold to report how slow a slow plugin is.
	wait := r.cfg.ReregisterThreshold + 10*time.Second
	single := r.outcome()
	for _, res := range r.resources {
		if n := r.initial[res]; n > 1 {
			single.fail(res, "registered %d times at start", n)
		}
	}
	if r.registry() {
		r.skipAll("plugin-watcher mode: the kubelet keeps plugins_registry sockets across restarts and finds them again by itself", CheckKubeletRestart, CheckSocketDeleted)
		r.checkOldEndpoint()
		for _, res := range r.resources {
			single.pass(res, "one registration at start")
		}
		r.conclude(CheckSingleReg, single)
		return
	}

	r.checkSocketDeleted(ctx, single, wait)
	r.checkKubeletRestarts(ctx, single, wait)
	r.checkOldEndpoint()
	r.conclude(CheckSingleReg, single)
}

// checkSocketDeleted deletes each resource's socket and judges the
// re-registration (restart.socket-deleted); extra registrations count
// against single.
func (r *runner) checkSocketDeleted(ctx context.Context, single *outcome, wait time.Duration) {
	threshold, slow := r.cfg.ReregisterThreshold, r.cfg.ReregisterWarn
	// The plugin's own socket is deleted. The kubelet does not do that to
	// a live plugin, so whatever goes wrong is a warning; a re-registration
	// it provokes is what restart.old-endpoint judges.
	sd := r.outcome()
	for _, res := range r.resources {
		c := r.emu.current(res)
		if c == nil {
			sd.skip(res, "not registered any more")
			continue
		}
		before := len(r.emu.registrations())
		t0 := time.Now()
		if err := removeFile(c.Socket); err != nil {
			sd.skip(res, "could not delete the socket: %v", err)
			continue
		}
		var got registration
		r.emu.waitFor(ctx, wait, func() bool {
			for _, reg := range r.emu.regs[before:] {
				if reg.Resource == res && reg.At.After(t0) && (reg.Err == nil || reg.Recreated) {
					got = *reg
					return true
				}
			}
			return false
		})
		if got.At.IsZero() {
			sd.warn(res, "did not register again within %s of its socket being deleted", wait)
			continue
		}
		r.quiet(ctx)
		n := 0
		for _, reg := range r.emu.registrations()[before:] {
			if reg.Resource == res && reg.counted() {
				n++
			}
		}
		if n > 1 {
			single.fail(res, "registered %d times after its socket was deleted", n)
		}
		d := got.At.Sub(t0).Round(time.Millisecond)
		switch {
		case got.Err != nil:
			sd.warn(res, "registered again after %s, on the re-created %s, and the kubelet refused it (%v); see %s", d, filepath.Base(got.Endpoint), got.Err, CheckOldEndpoint)
		case d > threshold:
			sd.warn(res, "registered again after %s, above the %s threshold", d, threshold)
		case d > slow:
			sd.warn(res, "registered again after %s, over %s", d, slow)
		default:
			sd.pass(res, "registered again after %s", d)
		}
	}
	r.conclude(CheckSocketDeleted, sd)
}

// checkKubeletRestarts restarts the emulated kubelet Restarts times and
// judges how fast every resource registers again (restart.kubelet);
// extra registrations count against single.
func (r *runner) checkKubeletRestarts(ctx context.Context, single *outcome, wait time.Duration) {
	threshold, slow := r.cfg.ReregisterThreshold, r.cfg.ReregisterWarn
	// Kubelet restarts.
	kr := r.outcome()
	worst := map[string]time.Duration{}
	failed := map[string]bool{}
	for i := 1; i <= r.cfg.Restarts; i++ {
		created, err := r.emu.restart()
		if err != nil {
			kr.fail("", "%v", err)
			break
		}
		r.emu.mu.Lock()
		epoch := r.emu.epoch
		r.emu.mu.Unlock()
		at := map[string]time.Time{}
		r.emu.waitFor(ctx, wait, func() bool {
			for _, reg := range r.emu.regs {
				if reg.Epoch == epoch && reg.Err == nil {
					if _, ok := at[reg.Resource]; !ok {
						at[reg.Resource] = reg.At
					}
				}
			}
			for _, res := range r.resources {
				if _, ok := at[res]; !ok && !failed[res] {
					return false
				}
			}
			return true
		})
		missing := false
		for _, res := range r.resources {
			if failed[res] {
				continue
			}
			t, ok := at[res]
			if !ok {
				kr.fail(res, "restart %d of %d: did not register again within %s of kubelet.sock being re-created", i, r.cfg.Restarts, wait)
				failed[res] = true
				missing = true
				continue
			}
			d := t.Sub(created)
			worst[res] = max(worst[res], d)
			if d > threshold {
				kr.fail(res, "restart %d of %d: registered again after %s, above the %s threshold", i, r.cfg.Restarts, d.Round(time.Millisecond), threshold)
				failed[res] = true
			}
		}
		r.quiet(ctx)
		for res, n := range r.registrationCounts(epoch) {
			if n > 1 {
				single.fail(res, "restart %d: registered %d times", i, n)
			}
		}
		if missing && len(failed) == len(r.resources) {
			break
		}
	}
	for _, res := range r.resources {
		switch {
		case failed[res]:
		case worst[res] > slow:
			kr.warn(res, "%d restarts; slowest re-registration %s, over %s: the node lacks the resource that long after every kubelet restart (threshold %s)", r.cfg.Restarts, worst[res].Round(time.Millisecond), slow, threshold)
		default:
			kr.pass(res, "%d restarts; slowest re-registration %s (threshold %s)", r.cfg.Restarts, worst[res].Round(time.Millisecond), threshold)
		}
		single.pass(res, "one registration per start and restart")
	}
	r.conclude(CheckKubeletRestart, kr)
}

// checkOldEndpoint judges every registration of the run that came while
// the emulated kubelet was still connected to the same resource: one on a
// socket path the plugin re-created while the kubelet's connection to the
// old socket there stayed open fails, as the kubelet refuses it.
func (r *runner) checkOldEndpoint() {
	o := r.outcome()
	regs := r.emu.registrations()
	for _, res := range r.resources {
		var refused, again []string
		prev := map[int]string{} // epoch -> endpoint of the latest accepted registration
		for _, reg := range regs {
			if reg.Resource != res {
				continue
			}
			if reg.Recreated {
				refused = append(refused, fmt.Sprintf("at %s it registered %s again after re-creating that socket, while the kubelet's connection to the old one was still open; the kubelet refused it: %v. Close the old connections (stop the old gRPC server) before registering, or listen on a new socket path",
					r.since(reg.At), filepath.Base(reg.Endpoint), reg.Err))
				continue
			}
			if reg.Err != nil {
				continue
			}
			switch p, ok := prev[reg.Epoch]; {
			case ok && p == reg.Endpoint:
				again = append(again, fmt.Sprintf("on the same socket %s after the old connection closed", filepath.Base(reg.Endpoint)))
			case ok:
				again = append(again, fmt.Sprintf("on a new socket %s (was %s)", filepath.Base(reg.Endpoint), filepath.Base(p)))
			}
			prev[reg.Epoch] = reg.Endpoint
		}
		switch {
		case len(refused) > 0:
			more := ""
			if len(refused) > 1 {
				more = fmt.Sprintf(" (%d such registrations)", len(refused))
			}
			o.fail(res, "%s%s", refused[0], more)
		case len(again) > 0:
			o.pass(res, "registered again %s", strings.Join(dedupe(again), "; "))
		case r.registry():
			o.skip(res, "plugin-watcher mode: the plugin did not register again while connected")
		default:
			o.skip(res, "the plugin did not register again while the kubelet was connected to it; see %s", CheckSocketDeleted)
		}
	}
	r.conclude(CheckOldEndpoint, o)
}
