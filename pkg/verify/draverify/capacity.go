package draverify

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/pkg/verify"
)

// Consumable capacity (KEP-5075): a device with allowMultipleAllocations
// is given to many claims, each allocation result with a shareID of its
// own and the capacity it consumes: the amount the request names, else
// the capacity's requestPolicy default, else all of it
// (k8s.io/dynamic-resource-allocation/structured, calculateConsumedCapacity).

// shareable is a device for the node that allows multiple allocations.
type shareable struct {
	pool string
	dev  resourcev1.Device
}

// multiAllocatable lists the devices of sl (newest generation of each
// pool) offered to node that allow multiple allocations, by pool and
// name.
func multiAllocatable(sl []resourcev1.ResourceSlice, node *corev1.Node) []shareable {
	var out []shareable
	for pool, ps := range newestPools(sl) {
		for i := range ps {
			s := &ps[i]
			for j := range s.Spec.Devices {
				d := &s.Spec.Devices[j]
				if ptr.Deref(d.AllowMultipleAllocations, false) && deviceForNode(s, d, node) {
					out = append(out, shareable{pool, *d})
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].pool != out[j].pool {
			return out[i].pool < out[j].pool
		}
		return out[i].dev.Name < out[j].dev.Name
	})
	return out
}

// policyProblems lists what is wrong with the request policies of a
// device's capacities that the API server does not refuse: a default
// outside 0 and the capacity's value (it checks a default only against
// validValues and a validRange, and against the capacity only through
// a validRange's max).
func policyProblems(s shareable) []string {
	var out []string
	names := make([]string, 0, len(s.dev.Capacity))
	for n := range s.dev.Capacity {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		c := s.dev.Capacity[resourcev1.QualifiedName(n)]
		if c.RequestPolicy == nil || c.RequestPolicy.Default == nil {
			continue
		}
		def := c.RequestPolicy.Default
		switch {
		case def.Sign() < 0:
			out = append(out, fmt.Sprintf("device %s/%s, capacity %s: requestPolicy default %s is negative, and the scheduler aborts the allocation of a claim that names no amount", s.pool, s.dev.Name, n, def))
		case def.Cmp(c.Value) > 0:
			out = append(out, fmt.Sprintf("device %s/%s, capacity %s: requestPolicy default %s is above the capacity's value %s, so that a claim that names no amount never fits", s.pool, s.dev.Name, n, def, c.Value.String()))
		}
	}
	return out
}

// consumption is what an allocation of s consumes of each capacity for
// a request that names no amount, and whether two such allocations fit
// at once; ok is false when not even one does.
func consumption(s shareable) (consumed map[resourcev1.QualifiedName]resource.Quantity, two, ok bool) {
	consumed = map[resourcev1.QualifiedName]resource.Quantity{}
	two, ok = true, true
	for n, c := range s.dev.Capacity {
		q := c.Value.DeepCopy()
		if c.RequestPolicy != nil && c.RequestPolicy.Default != nil {
			q = c.RequestPolicy.Default.DeepCopy()
		}
		consumed[n] = q
		if q.Sign() < 0 || q.Cmp(c.Value) > 0 {
			ok = false
		}
		double := q.DeepCopy()
		double.Add(q)
		if double.Cmp(c.Value) > 0 {
			two = false
		}
	}
	return consumed, two && ok, ok
}

// shareClaim is one claim given a share of a device.
type shareClaim struct {
	claim *resourcev1.ResourceClaim
	share types.UID
	res   *drav1.NodePrepareResourceResponse
}

// checkConsumableCapacity judges dra.slices.consumable-capacity: the
// request policies of the devices that allow multiple allocations, and,
// unless noPrepare says why not, two claims given shares of the first
// such device that fits one. It returns the claims it prepared.
func (r *run) checkConsumableCapacity(ctx context.Context, sl []resourcev1.ResourceSlice, listErr error, noPrepare string) []*resourcev1.ResourceClaim {
	id := verify.CheckDRAConsumableCapacity
	if listErr != nil {
		r.set(id, verify.Skip, "%v", listErr)
		return nil
	}
	devs := multiAllocatable(sl, r.nodeObject(ctx))
	if len(devs) == 0 {
		r.set(id, verify.Skip, "no device of the driver's slices for node %s allows multiple allocations (allowMultipleAllocations): the driver publishes no consumable capacity", r.node)
		return nil
	}
	var problems, warnings []string
	for _, d := range devs {
		problems = append(problems, policyProblems(d)...)
	}
	var dev *shareable
	var consumed map[resourcev1.QualifiedName]resource.Quantity
	var two bool
	// A device claim-a or claim-b holds is the last choice: the
	// scheduler gives shares of a device with room.
	held := r.heldDevices()
	for _, free := range []bool{true, false} {
		for i := range devs {
			if held[devs[i].pool+"/"+devs[i].dev.Name] == free {
				continue
			}
			if c, t, ok := consumption(devs[i]); ok && dev == nil {
				dev, consumed, two = &devs[i], c, t
			}
		}
	}
	var shares []shareClaim
	var prepared []*resourcev1.ResourceClaim
	note := ""
	switch {
	case noPrepare != "":
		note = "; no shares prepared: " + noPrepare
	case dev == nil:
		note = "; no device allows even one share that names no amount, so none was prepared"
	default:
		var skip string
		restore := r.makeRoomFor(ctx, sl, *dev)
		shares, problems, warnings, skip = r.prepareShares(ctx, *dev, consumed, two, problems)
		restore()
		if skip != "" {
			r.set(id, verify.Skip, "%s", skip)
			return nil
		}
		for _, s := range shares {
			if s.res != nil {
				prepared = append(prepared, s.claim)
			}
		}
	}
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.pool + "/" + d.dev.Name
	}
	switch {
	case len(problems) > 0:
		r.set(id, verify.Fail, "%s", strings.Join(problems, "; "))
	case noPrepare != "":
		r.set(id, verify.Skip, "the request policies of %s are consistent%s", strings.Join(names, ", "), note)
	case len(warnings) > 0:
		r.set(id, verify.Warn, "%s", strings.Join(warnings, "; "))
	case len(shares) == 0:
		r.set(id, verify.Pass, "the request policies of %s are consistent%s", strings.Join(names, ", "), note)
	default:
		how := "prepared together"
		if !two {
			how = "prepared one after the other (two do not fit at once)"
		}
		r.set(id, verify.Pass, "the request policies of %s are consistent; two claims given shares %s and %s of %s/%s, %s, each answered with its share and CDI devices of its own",
			strings.Join(names, ", "), shares[0].share, shares[1].share, dev.pool, dev.dev.Name, how)
	}
	return prepared
}

// prepareShares writes two claims given shares of dev and prepares them,
// together when two fit at once, and unprepares them. It adds what is
// wrong with the answers to problems and returns it; skip says why the
// check cannot be judged (the prepare timeout ran out).
func (r *run) prepareShares(ctx context.Context, dev shareable, consumed map[resourcev1.QualifiedName]resource.Quantity, two bool, problems []string) (shares []shareClaim, _, warnings []string, skip string) {
	for i := range 2 {
		role := fmt.Sprintf("claim-share-%d", i+1)
		share := uuid.NewUUID()
		c, err := r.writeClaim(ctx, role, resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "req", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "dpkit-verify"},
		}}}}, []resourcev1.DeviceRequestAllocationResult{{
			Request: "req", Driver: r.driver, Pool: dev.pool, Device: dev.dev.Name, ShareID: &share, ConsumedCapacity: consumed,
		}})
		if err != nil {
			return nil, problems, nil, "the claims could not be written: " + err.Error()
		}
		shares = append(shares, shareClaim{claim: c, share: share})
	}
	defer func() {
		for _, s := range shares {
			if s.res != nil {
				_, _ = r.unprepare(ctx, ref(s.claim))
			}
		}
	}()
	for i := range shares {
		s := &shares[i]
		if i == 1 && !two && shares[0].res != nil {
			_, _ = r.unprepare(ctx, ref(shares[0].claim))
		}
		res, timedOut, err := r.prepareAlone(ctx, s.claim)
		switch {
		case timedOut:
			return shares, problems, nil, "see " + verify.CheckDRATimeout
		case err != nil:
			problems = append(problems, fmt.Sprintf("%s, given share %s of device %s/%s, was %v", s.claim.Name, s.share, dev.pool, dev.dev.Name, err))
			continue
		}
		s.res = res
		devs := answered(res, dev.pool, dev.dev.Name)
		if len(devs) == 0 {
			problems = append(problems, fmt.Sprintf("%s, given share %s of device %s/%s, was answered with %s, not its device", s.claim.Name, s.share, dev.pool, dev.dev.Name, deviceKey(res)))
			continue
		}
		// share_id is in dra v1 only.
		if r.plugin.Service() != drav1.DRAPluginService {
			continue
		}
		for _, d := range devs {
			switch got := d.ShareId; {
			case got == nil:
				warnings = append(warnings, fmt.Sprintf("%s, given share %s of device %s/%s, was answered without share_id: the kubelet's checkpoint and PodResources (ClaimResource.share_id) cannot tell the shares apart", s.claim.Name, s.share, dev.pool, dev.dev.Name))
			case *got != string(s.share):
				problems = append(problems, fmt.Sprintf("%s, given share %s of device %s/%s, was answered with share_id %s: the kubelet keeps what the driver answers", s.claim.Name, s.share, dev.pool, dev.dev.Name, *got))
			}
		}
	}
	if shares[0].res == nil || shares[1].res == nil {
		return shares, problems, warnings, ""
	}
	ids0, ids1 := cdiIDs(shares[0].res), cdiIDs(shares[1].res)
	switch {
	case r.results[verify.CheckDRACDIUnique].Verdict == verify.Fail:
		// One cause, one failure: a driver that names CDI devices
		// after the device fails dra.prepare.cdi-unique already.
	case len(ids0) > 0 && slices.Equal(ids0, ids1):
		warnings = append(warnings, fmt.Sprintf("the two shares of device %s/%s were given the same CDI devices (%s): their containers cannot tell their shares apart", dev.pool, dev.dev.Name, strings.Join(ids0, ", ")))
	case two:
		idx := indexCDI(r.cdiDir)
		for _, cid := range append(ids0, ids1...) {
			if files := idx[cid]; len(files) > 1 {
				problems = append(problems, fmt.Sprintf("with both shares of device %s/%s prepared, %s is in %s: the container runtime leaves it out", dev.pool, dev.dev.Name, cid, strings.Join(files, " and ")))
			}
		}
	}
	return shares, problems, warnings, ""
}

// held returns claim-a and claim-b where they hold an allocation, and
// the devices they hold.
func (r *run) held() (claims []*resourcev1.ResourceClaim, devices []resourcev1.DeviceRequestAllocationResult) {
	for _, role := range []string{"claim-a", "claim-b"} {
		if c := r.claims[role]; c != nil && c.Status.Allocation != nil {
			claims = append(claims, c)
			devices = append(devices, c.Status.Allocation.Devices.Results...)
		}
	}
	return claims, devices
}

// heldDevices returns the devices claim-a and claim-b hold, as
// pool/device.
func (r *run) heldDevices() map[string]bool {
	held := map[string]bool{}
	_, devices := r.held()
	for _, res := range devices {
		held[res.Pool+"/"+res.Device] = true
	}
	return held
}

// makeRoomFor unprepares claim-a and claim-b when they hold the shared
// device dev itself (all of it, by its default), or devices that take
// counters it needs (partitions of the GPU it is): the scheduler would
// give no share of it while they are held, and a driver that keeps its
// capacities and counters refuses one. The returned function prepares
// them again.
func (r *run) makeRoomFor(ctx context.Context, sl []resourcev1.ResourceSlice, dev shareable) func() {
	claims, devices := r.held()
	var held []string
	holdsDev := false
	for _, res := range devices {
		if res.Pool == dev.pool {
			held = append(held, res.Device)
			holdsDev = holdsDev || res.Device == dev.dev.Name
		}
	}
	want := append(slices.Clone(held), dev.dev.Name)
	fits := len(dev.dev.ConsumesCounters) == 0 || len(fitTogether(newestPools(sl)[dev.pool], want)) == len(want)
	if (fits && !holdsDev) || len(claims) == 0 {
		return func() {}
	}
	refs := make([]*drav1.Claim, len(claims))
	for i, c := range claims {
		refs[i] = ref(c)
	}
	_, _ = r.unprepare(ctx, refs...)
	return func() { _, _ = r.prepare(ctx, claims...) }
}
