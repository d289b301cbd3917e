package verify

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds of allocate.every-device, so that a plugin with ten thousand
// devices is checked in seconds.
const (
	// everyDeviceAlone is how many devices are asked for one by one; of
	// more, an even sample that has the first and the last.
	everyDeviceAlone = 256
	// everyDeviceBudget bounds the time the check's calls take in all;
	// the detail says how far they got.
	everyDeviceBudget = 10 * time.Second
)

// everyDeviceRequests returns what allocate.every-device asks Allocate
// for, each as one container request: every healthy device alone (an even
// sample of everyDeviceAlone of them when there are more), the same
// devices in pairs (the last one of an odd number with the first), and all
// of them together when there are more than two. Like the preferred
// questions, they depend only on the set of healthy devices.
func everyDeviceRequests(healthy []string) (alone []string, pairs [][]string, all []string) {
	ids := slices.Compact(slices.Sorted(slices.Values(healthy)))
	alone = ids
	if n := len(ids); n > everyDeviceAlone {
		alone = make([]string, everyDeviceAlone)
		for i := range alone {
			alone[i] = ids[i*(n-1)/(everyDeviceAlone-1)]
		}
	}
	if len(alone) < 2 {
		return alone, nil, nil
	}
	for i := 0; i < len(alone); i += 2 {
		if i+1 < len(alone) {
			pairs = append(pairs, []string{alone[i], alone[i+1]})
		} else {
			pairs = append(pairs, []string{alone[i], alone[0]})
		}
	}
	if len(alone) > 2 {
		all = alone
	}
	return alone, pairs, all
}

// allocFailure is an Allocate call of allocate.every-device that failed.
type allocFailure struct {
	ids []string
	msg string
	// code is the call's gRPC status code (Unknown when it had none).
	code codes.Code
}

// refusal reports whether f is a request the plugin declined on purpose:
// InvalidArgument for a request of several devices, such as NVIDIA's
// failRequestsGreaterThanOne on time-sliced GPUs.
func (f allocFailure) refusal() bool {
	return len(f.ids) > 1 && f.code == codes.InvalidArgument
}

func (f allocFailure) String() string {
	q := make([]string, len(f.ids))
	for i, id := range f.ids {
		q[i] = strconv.Quote(id)
	}
	return strings.Join(q, " + ") + " (" + f.msg + ")"
}

// everyDevice decides allocate.every-device for res: it asks Allocate for
// each healthy device alone, then in pairs and all together, and returns
// the devices that failed alone. A call that fails because a device
// changed health meanwhile (the kubelet's stream no longer lists it
// healthy) is not held against the plugin.
func (r *runner) everyDevice(ctx context.Context, o *outcome, res string, c *conn, healthy []string) (failedAlone map[string]bool) {
	alone, pairs, all := everyDeviceRequests(healthy)
	if len(alone) == 0 {
		o.skip(res, "no healthy device to allocate%s", r.viewNote(res))
		return nil
	}
	deadline := time.Now().Add(everyDeviceBudget)
	cut := false // the budget ran out
	more := func() bool {
		cut = cut || time.Now().After(deadline)
		return ctx.Err() == nil && !cut
	}
	call := func(ids []string) *allocFailure {
		out, err := r.allocate(ctx, c, ids)
		switch {
		case err != nil:
			return &allocFailure{ids: ids, msg: statusMessage(err), code: status.Code(err)}
		case len(out.ContainerResponses) != 1:
			return &allocFailure{ids: ids, msg: fmt.Sprintf("%d responses to 1 container request", len(out.ContainerResponses))}
		}
		return nil
	}
	var aloneFails, groupFails []allocFailure
	triedAlone, triedPairs, triedAll := 0, 0, false
	failedAlone = map[string]bool{}
	for _, id := range alone {
		if !more() {
			break
		}
		triedAlone++
		if f := call([]string{id}); f != nil {
			aloneFails = append(aloneFails, *f)
			failedAlone[id] = true
		}
	}
	// A group with a device that failed alone tells nothing new.
	hasFailed := func(id string) bool { return failedAlone[id] }
	for _, g := range pairs {
		if !more() {
			break
		}
		if slices.ContainsFunc(g, hasFailed) {
			continue
		}
		triedPairs++
		if f := call(g); f != nil {
			groupFails = append(groupFails, *f)
		}
	}
	if all != nil && more() && !slices.ContainsFunc(all, hasFailed) {
		triedAll = true
		if f := call(all); f != nil {
			groupFails = append(groupFails, *f)
		}
	}
	aloneFails, groupFails, changed := r.unexplained(ctx, c, aloneFails, groupFails)
	for id := range failedAlone {
		if !slices.ContainsFunc(aloneFails, func(f allocFailure) bool { return f.ids[0] == id }) {
			delete(failedAlone, id)
		}
	}

	tried := fmt.Sprintf("%d of %d healthy devices alone", triedAlone, len(healthy))
	if len(pairs) > 0 {
		tried += ", " + plural(triedPairs, "pair")
	}
	if triedAll {
		tried += fmt.Sprintf(", all %d in one request", len(all))
	}
	var notes []string
	if len(alone) < len(healthy) {
		notes = append(notes, fmt.Sprintf("an even sample of %d, the first and the last included", everyDeviceAlone))
	}
	if len(failedAlone) > 0 && len(pairs) > 0 {
		notes = append(notes, "requests with a device that failed alone were not made")
	}
	if cut {
		notes = append(notes, fmt.Sprintf("stopped when the %s the check may take ran out", everyDeviceBudget))
	}
	if changed > 0 {
		notes = append(notes, fmt.Sprintf("%s refused a device that changed health meanwhile, as it should", plural(changed, "call")))
	}
	if len(notes) > 0 {
		tried += " (" + strings.Join(notes, "; ") + ")"
	}
	// Requests of several devices declined on purpose (InvalidArgument,
	// every device having succeeded alone) are the plugin's policy, not a
	// bug: the kubelet fails such a pod's admission all the same, so they
	// warn.
	refused := slices.DeleteFunc(slices.Clone(groupFails), func(f allocFailure) bool { return !f.refusal() })
	groupFails = slices.DeleteFunc(groupFails, allocFailure.refusal)
	var problems []string
	if len(aloneFails) > 0 {
		problems = append(problems, fmt.Sprintf("Allocate failed for %d of the %d devices asked for alone: %s", len(aloneFails), triedAlone, someFailures(aloneFails)))
	}
	if len(groupFails) > 0 {
		problems = append(problems, fmt.Sprintf("Allocate failed for %s of several devices that each succeeded alone: %s", plural(len(groupFails), "request"), someFailures(groupFails)))
	}
	if len(problems) > 0 {
		o.fail(res, "%s; the kubelet fails the admission of a pod given these devices. Tried %s", strings.Join(problems, "; "), tried)
		return failedAlone
	}
	if len(refused) > 0 {
		o.warn(res, "Allocate refused %s of several devices with InvalidArgument, each device having succeeded alone: %s; a policy (one device per container, as with time-sliced replicas), but the kubelet fails the admission of a pod that asks for more: say so in the plugin's documentation. Tried %s", plural(len(refused), "request"), someFailures(refused), tried)
		return failedAlone
	}
	o.pass(res, "%s: every call succeeded with one response", tried)
	return failedAlone
}

// someFailures names the first three failures and counts the others.
func someFailures(fails []allocFailure) string {
	out := make([]string, 0, 4)
	for _, f := range fails[:min(3, len(fails))] {
		out = append(out, f.String())
	}
	if len(fails) > 3 {
		out = append(out, fmt.Sprintf("and %d more", len(fails)-3))
	}
	return strings.Join(out, "; ")
}

// unexplained drops the failures of calls that asked for a device which
// the kubelet's stream of c no longer lists as healthy: the plugin was
// right to refuse it. It waits up to QuietPeriod for the stream to show
// such a change, since the plugin may refuse a device a moment before its
// update arrives, and returns how many failures it dropped.
func (r *runner) unexplained(ctx context.Context, c *conn, alone, groups []allocFailure) (stillAlone, stillGroups []allocFailure, dropped int) {
	if len(alone)+len(groups) == 0 {
		return nil, nil, 0
	}
	var healthy map[string]bool
	explained := func(f allocFailure) bool {
		return slices.ContainsFunc(f.ids, func(id string) bool { return !healthy[id] })
	}
	r.emu.waitFor(ctx, r.cfg.QuietPeriod, func() bool {
		healthy = map[string]bool{}
		for _, id := range healthyNow(c) {
			healthy[id] = true
		}
		for _, f := range slices.Concat(alone, groups) {
			if !explained(f) {
				return false
			}
		}
		return true
	})
	keep := func(fails []allocFailure) []allocFailure {
		var out []allocFailure
		for _, f := range fails {
			if explained(f) {
				dropped++
			} else {
				out = append(out, f)
			}
		}
		return out
	}
	return keep(alone), keep(groups), dropped
}

// plural says n things: "1 pair", "3 pairs".
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
