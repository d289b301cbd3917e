package draverify

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/dpkit/dpkit/pkg/verify"
)

func (r *run) checkShutdown(ctx context.Context) bool {
	// The kubelet's deadline cancels a call that runs out of it: the
	// kubelet fails the pod then, whatever the cause, so this one stays a
	// failure (pkg/kubelet/cm/dra/plugin/dra_plugin.go, 45s).
	switch {
	case r.slowest > r.cfg.PrepareTimeout:
		r.set(verify.CheckDRATimeout, verify.Fail, "%s took over %s", r.slowestCall, r.cfg.PrepareTimeout)
	case r.slowest >= r.cfg.PrepareTimeout:
		r.set(verify.CheckDRATimeout, verify.Fail, "%s ran out of the %s the kubelet gives it", r.slowestCall, r.cfg.PrepareTimeout)
	default:
		r.set(verify.CheckDRATimeout, verify.Pass, "slowest call %s: %s (limit %s)", r.slowestCall, r.slowest.Round(time.Millisecond), r.cfg.PrepareTimeout)
	}
	if r.proc.Exit() != "" {
		return true // steps reports it
	}
	// SIGTERM lands on a driver done starting: registered (the restart's
	// check waited for that) and done publishing.
	r.settle(ctx, time.Time{})
	socks := r.sockets()
	// A driver slower than --term-timeout but gone within twice that is
	// a time, a warning; one still running then is killed, as the
	// kubelet kills a pod after its grace period.
	took, err := r.signalWait(syscall.SIGTERM, 2*r.cfg.TermTimeout)
	var left []string
	for _, s := range socks {
		if _, err := os.Lstat(s); err == nil {
			left = append(left, s)
		}
	}
	switch {
	case err != nil:
		r.set(verify.CheckDRAExit, verify.Fail, "still running %s after SIGTERM (twice --term-timeout %s); killed", 2*r.cfg.TermTimeout, r.cfg.TermTimeout)
	case len(left) > 0:
		r.set(verify.CheckDRAExit, verify.Fail, "%s %s after SIGTERM but left its sockets: %s", r.proc.Exit(), took.Round(time.Millisecond), r.rel(left))
	case took > r.cfg.TermTimeout:
		r.set(verify.CheckDRAExit, verify.Warn, "%s %s after SIGTERM, over --term-timeout %s; sockets removed", r.proc.Exit(), took.Round(time.Millisecond), r.cfg.TermTimeout)
	default:
		r.set(verify.CheckDRAExit, verify.Pass, "%s %s after SIGTERM; sockets removed", r.proc.Exit(), took.Round(time.Millisecond))
	}
	r.checkGeneration(ctx)
	sl, err := r.slicesNow(ctx)
	var byName, other int
	for _, s := range sl {
		if s.Spec.NodeName != nil {
			byName++
		} else {
			other++
		}
	}
	switch {
	case err != nil:
		r.set(verify.CheckDRASlicesRemoved, verify.Skip, "listing the ResourceSlices: %v", err)
	case len(sl) == 0:
		r.set(verify.CheckDRASlicesRemoved, verify.Pass, "the driver removed its ResourceSlices")
	default:
		var what string
		if byName > 0 {
			what = fmt.Sprintf("%d ResourceSlice(s) with spec.nodeName left to the kubelet, which deletes them when the driver stays unregistered", byName)
		}
		if other > 0 {
			if what != "" {
				what += "; "
			}
			what += fmt.Sprintf("%d ResourceSlice(s) that select the node otherwise left to the driver, which keeps them for its next start (the kubelet deletes only spec.nodeName slices; the Node's deletion those it owns)", other)
		}
		r.set(verify.CheckDRASlicesRemoved, verify.Pass, "%s", what)
	}
	return true
}
