package draverify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// The calls the kubelet makes that the Prepare checks do not: several
// claims in one call (dra.prepare.batch), calls for different pods at
// once (dra.prepare.concurrent) and a claim allocated on another node
// (dra.prepare.other-node). Each check makes claims of its own on the
// driver's devices and unprepares them when it is done, so that the
// next finds every device free.

// batchClaims and concurrentCalls are how many claims the batch check
// sends in one call and how many calls the concurrent check makes at
// once, at most: one per device.
const (
	batchClaims     = 3
	concurrentCalls = 4
)

// checkCalls frees the devices that claim-a and claim-b hold, then runs
// the batch, concurrent and other-node checks.
func (r *run) checkCalls(ctx context.Context) bool {
	r.releasePrepared(ctx)
	r.checkBatch(ctx)
	r.checkConcurrent(ctx)
	r.checkOtherNode(ctx)
	return true
}

// releasePrepared unprepares the claims the Prepare checks may have left
// prepared (also when their answer was judged wrong), one call each:
// what happens to them was judged already.
func (r *run) releasePrepared(ctx context.Context) {
	for _, role := range []string{"claim-a", "claim-b"} {
		c := r.claims[role]
		if c == nil {
			continue
		}
		if _, err := r.unprepare(ctx, ref(c)); err != nil {
			r.log.Debug("Unpreparing a claim of the Prepare checks", "claim", c.Name, "err", err)
		}
	}
}

// newClaims makes one claim per device, named role-<i>.
func (r *run) newClaims(ctx context.Context, role string, devices []string) ([]*resourcev1.ResourceClaim, error) {
	var out []*resourcev1.ResourceClaim
	for i, d := range devices {
		c, err := r.newClaim(ctx, fmt.Sprintf("%s-%d", role, i), d, false)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// forget unprepares claims, one call each, and ignores the answers: the
// clean-up of a check, so that the next finds the devices free.
func (r *run) forget(ctx context.Context, claims ...*resourcev1.ResourceClaim) {
	for _, c := range claims {
		if _, err := r.unprepare(ctx, ref(c)); err != nil {
			r.log.Debug("Clean-up Unprepare", "claim", c.Name, "err", err)
		}
	}
}

// allocated is the pool/device the claim's allocation names.
func allocated(c *resourcev1.ResourceClaim) string {
	res := c.Status.Allocation.Devices.Results[0]
	return res.Pool + "/" + res.Device
}

// preparedProblems judges a NodePrepareResources answer for claims: one
// result for each, keyed by its UID, without an error and with the
// allocated device; none for a claim not asked for.
func preparedProblems(resp *drav1.NodePrepareResourcesResponse, claims []*resourcev1.ResourceClaim) []string {
	var problems []string
	for _, c := range claims {
		res, ok := resp.GetClaims()[string(c.UID)]
		want := allocated(c)
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("no result for %s (UID %s)", c.Name, c.UID))
		case res.GetError() != "":
			problems = append(problems, fmt.Sprintf("%s (device %s): %s", c.Name, want, res.GetError()))
		case !slices.ContainsFunc(res.GetDevices(), func(d *drav1.Device) bool { return d.PoolName+"/"+d.DeviceName == want }):
			problems = append(problems, fmt.Sprintf("%s: the result names %q, not the allocated device %s", c.Name, deviceKey(res), want))
		}
	}
	// The kubelet fails the pod on a result for a UID it did not send
	// (lookupClaimRequest).
	extra := 0
	for uid := range resp.GetClaims() {
		if !slices.ContainsFunc(claims, func(c *resourcev1.ResourceClaim) bool { return string(c.UID) == uid }) {
			extra++
		}
	}
	if extra > 0 {
		problems = append(problems, fmt.Sprintf("%d result(s) for claims not asked for", extra))
	}
	return problems
}

// unpreparedProblems judges a NodeUnprepareResources answer for claims:
// one result for each, keyed by its UID, without an error.
func unpreparedProblems(resp *drav1.NodeUnprepareResourcesResponse, claims []*resourcev1.ResourceClaim) []string {
	var problems []string
	for _, c := range claims {
		res, ok := resp.GetClaims()[string(c.UID)]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("no result for %s (UID %s)", c.Name, c.UID))
		case res.GetError() != "":
			problems = append(problems, fmt.Sprintf("%s: %s", c.Name, res.GetError()))
		}
	}
	return problems
}

// cdiDefined maps every CDI device ID that a spec file of the CDI
// directory defines to the file's name; files that do not parse are
// dra.prepare.cdi's to judge and left out.
func (r *run) cdiDefined() map[string]string {
	out := map[string]string{}
	entries, _ := os.ReadDir(r.cdiDir)
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		spec, err := readSpec(filepath.Join(r.cdiDir, e.Name()))
		if err != nil {
			continue
		}
		for _, d := range spec.Devices {
			out[spec.Kind+"="+d.Name] = e.Name()
		}
	}
	return out
}

// cdiAdded lists, sorted, the CDI IDs of res that now are defined and
// were not in before: the specs the claim's Prepare wrote, which its
// Unprepare must remove (a spec the driver keeps for a device, written
// before, stays).
func (r *run) cdiAdded(before map[string]string, res *drav1.NodePrepareResourceResponse) []string {
	now := r.cdiDefined()
	var out []string
	for _, d := range res.GetDevices() {
		for _, id := range d.CdiDeviceIds {
			if _, was := before[id]; !was && now[id] != "" && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	sort.Strings(out)
	return out
}

// cdiLeft lists the IDs of ids a spec file still defines, with the file.
func (r *run) cdiLeft(ids []string) []string {
	now := r.cdiDefined()
	var out []string
	for _, id := range ids {
		if f := now[id]; f != "" {
			out = append(out, id+" (in "+f+")")
		}
	}
	return out
}

// checkBatch prepares several claims in one call and unprepares them in
// one call, as the kubelet does for the claims of one pod.
func (r *run) checkBatch(ctx context.Context) {
	id := verify.CheckDRABatch
	if r.decided(id) {
		return
	}
	if r.results[verify.CheckDRAPrepare].Verdict == verify.Fail {
		// One cause, one failure: a driver that answers two claims in
		// one call wrongly answers three so too.
		r.set(id, verify.Skip, "see %s", verify.CheckDRAPrepare)
		return
	}
	n := min(batchClaims, len(r.devices))
	if n < 2 {
		r.set(id, verify.Skip, "the driver publishes one device for the node: several claims in one call need several devices")
		return
	}
	claims, err := r.newClaims(ctx, "claim-batch", r.devices[:n])
	if err != nil {
		r.set(id, verify.Skip, "%v", err)
		return
	}
	defer r.forget(ctx, claims...)
	var names []string
	refs := make([]*drav1.Claim, len(claims))
	for i, c := range claims {
		names = append(names, c.Name+" ("+allocated(c)+")")
		refs[i] = ref(c)
	}
	before := r.cdiDefined()
	resp, err := r.prepare(ctx, claims...)
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(id, verify.Skip, "%v", err)
		return
	case err != nil:
		r.set(id, verify.Fail, "NodePrepareResources of %s in one call: %v", strings.Join(names, ", "), err)
		return
	}
	if problems := preparedProblems(resp, claims); len(problems) > 0 {
		r.set(id, verify.Fail, "NodePrepareResources of %d claims in one call: %s", len(claims), strings.Join(problems, "; "))
		return
	}
	var added []string
	for _, c := range claims {
		added = append(added, r.cdiAdded(before, resp.Claims[string(c.UID)])...)
	}
	uresp, err := r.unprepare(ctx, refs...)
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(id, verify.Skip, "%v", err)
		return
	case err != nil:
		r.set(id, verify.Fail, "NodeUnprepareResources of %d claims in one call: %v", len(claims), err)
		return
	}
	problems := unpreparedProblems(uresp, claims)
	if left := r.cdiLeft(added); len(left) > 0 {
		problems = append(problems, "their CDI specs still define "+strings.Join(left, ", "))
	}
	if len(problems) > 0 {
		r.set(id, verify.Fail, "NodeUnprepareResources of %d claims in one call: %s", len(claims), strings.Join(problems, "; "))
		return
	}
	cdi := fmt.Sprintf("%d CDI ID(s) written and removed", len(added))
	if len(added) == 0 {
		cdi = "no CDI spec written (see " + verify.CheckDRACDI + ")"
	}
	r.set(id, verify.Pass, "%s prepared in one call and unprepared in one call; %s", strings.Join(names, ", "), cdi)
}

// timedCall is one call of checkConcurrent: timed as prepare and
// unprepare time theirs, and recorded once every call is back.
type timedCall struct {
	what string
	took time.Duration
	err  error
}

// concurrently runs fn for every claim at once, each with the kubelet's
// deadline, and records the slowest as timed does.
func (r *run) concurrently(ctx context.Context, what string, claims []*resourcev1.ResourceClaim, fn func(context.Context, *resourcev1.ResourceClaim) error) []timedCall {
	out := make([]timedCall, len(claims))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, c := range claims {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, r.cfg.PrepareTimeout)
			defer cancel()
			<-start
			t0 := time.Now()
			err := fn(ctx, c)
			out[i] = timedCall{what: what + "(" + c.Name + ")", took: time.Since(t0), err: err}
			if deadline, _ := ctx.Deadline(); ctx.Err() == context.DeadlineExceeded || (err != nil && !time.Now().Before(deadline)) {
				out[i].err = fmt.Errorf("%s %w after %s (see %s)", out[i].what, errTimedOut, r.cfg.PrepareTimeout, verify.CheckDRATimeout)
			}
		})
	}
	close(start)
	wg.Wait()
	for _, c := range out {
		if c.took > r.slowest {
			r.slowest, r.slowestCall = c.took, c.what
		}
	}
	return out
}

// checkConcurrent prepares claims in calls made at once, then
// unprepares them so, as the kubelet's pod workers do for different
// pods.
func (r *run) checkConcurrent(ctx context.Context) {
	id := verify.CheckDRAConcurrent
	if r.decided(id) {
		return
	}
	n := min(concurrentCalls, len(r.devices))
	if n < 2 {
		r.set(id, verify.Skip, "the driver publishes one device for the node: calls for different claims at once need several devices")
		return
	}
	claims, err := r.newClaims(ctx, "claim-concurrent", r.devices[:n])
	if err != nil {
		r.set(id, verify.Skip, "%v", err)
		return
	}
	defer r.forget(ctx, claims...)
	answers := make([]*drav1.NodePrepareResourcesResponse, len(claims))
	index := func(c *resourcev1.ResourceClaim) int { return slices.Index(claims, c) }
	// Each call is another pod's: one claim each, as the pod workers
	// send them.
	calls := r.concurrently(ctx, "NodePrepareResources", claims, func(ctx context.Context, c *resourcev1.ResourceClaim) (err error) {
		answers[index(c)], err = r.plugin.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{ref(c)}})
		return err
	})
	if verdict, detail := judgeConcurrent(calls); verdict != "" {
		r.set(id, verdict, "%d NodePrepareResources calls at once: %s", n, detail)
		return
	}
	var problems []string
	for i, c := range claims {
		problems = append(problems, preparedProblems(answers[i], []*resourcev1.ResourceClaim{c})...)
	}
	if len(problems) > 0 {
		r.set(id, verify.Fail, "%d NodePrepareResources calls at once: %s", n, strings.Join(problems, "; "))
		return
	}
	uanswers := make([]*drav1.NodeUnprepareResourcesResponse, len(claims))
	calls = r.concurrently(ctx, "NodeUnprepareResources", claims, func(ctx context.Context, c *resourcev1.ResourceClaim) (err error) {
		uanswers[index(c)], err = r.plugin.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: []*drav1.Claim{ref(c)}})
		return err
	})
	if verdict, detail := judgeConcurrent(calls); verdict != "" {
		r.set(id, verdict, "%d NodeUnprepareResources calls at once: %s", n, detail)
		return
	}
	for i, c := range claims {
		problems = append(problems, unpreparedProblems(uanswers[i], []*resourcev1.ResourceClaim{c})...)
	}
	if len(problems) > 0 {
		r.set(id, verify.Fail, "%d NodeUnprepareResources calls at once: %s", n, strings.Join(problems, "; "))
		return
	}
	var slowest time.Duration
	for _, c := range calls {
		slowest = max(slowest, c.took)
	}
	r.set(id, verify.Pass, "%d NodePrepareResources calls at once, each for a claim on another device, got their devices; %d NodeUnprepareResources calls at once succeeded (slowest %s)", n, n, slowest.Round(time.Millisecond))
}

// judgeConcurrent is the verdict on calls made at once that failed: a
// skip when one ran out of time (dra.prepare.timeout judges that), a
// failure naming the errors otherwise; "" when none failed.
func judgeConcurrent(calls []timedCall) (verify.Verdict, string) {
	var errs []string
	for _, c := range calls {
		switch {
		case c.err == nil:
		case errors.Is(c.err, errTimedOut):
			return verify.Skip, c.err.Error()
		default:
			errs = append(errs, fmt.Sprintf("%s: %v", c.what, c.err))
		}
	}
	if len(errs) == 0 {
		return "", ""
	}
	return verify.Fail, fmt.Sprintf("%d of %d failed: %s", len(errs), len(calls), strings.Join(errs, "; "))
}

// otherPool is the pool of another node that claim-other-node names.
func (r *run) otherPool() string { return "dpkit-verify-other-node-" + r.sb.id }

// checkOtherNode prepares a claim allocated a device of the driver's
// name in a pool it does not publish for the node.
func (r *run) checkOtherNode(ctx context.Context) {
	id := verify.CheckDRAOtherNode
	if r.decided(id) {
		return
	}
	claim, err := r.newClaimIn(ctx, "claim-other-node", r.otherPool(), r.devices[0], false)
	if err != nil {
		r.set(id, verify.Skip, "%v", err)
		return
	}
	defer r.forget(ctx, claim)
	where := fmt.Sprintf("claim-other-node, allocated device %s of pool %s (not one the driver publishes for Node %s; its pool there is %s)", r.devices[0], r.otherPool(), r.node, r.pool)
	resp, err := r.prepare(ctx, claim)
	res := resp.GetClaims()[string(claim.UID)]
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(id, verify.Skip, "%v", err)
	case err != nil:
		// Refused, if for the whole call: dra.prepare.per-claim-error
		// judges that.
		r.set(id, verify.Pass, "%s: refused for the whole call (%v)", where, err)
	case res == nil:
		r.set(id, verify.Fail, "%s: no result for it", where)
	case res.GetError() != "":
		r.set(id, verify.Pass, "%s: refused: %s", where, res.GetError())
	default:
		r.set(id, verify.Fail, "%s was prepared: %s; a container would get a device of this node for a claim allocated on another", where, deviceKey(res))
	}
}
