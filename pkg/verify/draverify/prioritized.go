package draverify

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// The prioritized list (KEP-4816, firstAvailable): the scheduler picks
// one subrequest of a request and names it in the allocation result as
// "<request>/<subrequest>". A container names the request by its main
// name only (pod validation: a DNS label), and the kubelet hands it the
// CDI devices of each answered device whose request_names is empty or
// holds exactly that name (pkg/kubelet/cm/dra/claiminfo.go
// cdiDevicesAsList); it strips nothing.

// Names of the prioritized-list claim.
const (
	firstAvailableRole = "claim-first-available"
	firstRequest       = "req"
	firstChosen        = "small" // the second subrequest: the scheduler fell back to it
)

// requestNameProblem says why the answered devices of device would reach
// no container that names request (its main name); "" when they would.
func requestNameProblem(devs []*drav1.Device, request string) string {
	var wrong []string
	for _, d := range devs {
		names := d.GetRequestNames()
		if len(names) == 0 || slices.Contains(names, request) {
			continue
		}
		wrong = append(wrong, fmt.Sprintf("%q", names))
	}
	if len(wrong) == 0 {
		return ""
	}
	return fmt.Sprintf("answered under request names %s, not %q: the kubelet gives a container the CDI devices of a device whose request_names holds exactly the request it names (or is empty), and a container names the request by its main name %q", strings.Join(wrong, ", "), request, request)
}

// lend picks a device for a claim of a check: one that neither claim-a
// nor claim-b holds, else the device of one of them, which is
// unprepared for the check and prepared again after it (lender says
// which).
func (r *run) lend() (device, lender string) {
	held := map[string]string{}
	for _, role := range []string{"claim-b", "claim-a"} {
		if c := r.claims[role]; c != nil && r.prepared[string(c.UID)] != nil {
			held[c.Status.Allocation.Devices.Results[0].Device] = role
		}
	}
	for _, d := range r.devices {
		if held[d] == "" {
			return d, ""
		}
	}
	for _, role := range []string{"claim-b", "claim-a"} {
		for d, h := range held {
			if h == role {
				return d, role
			}
		}
	}
	return r.devices[0], ""
}

// checkPrioritizedList judges dra.prepare.prioritized-list with a claim
// whose request "req" is a firstAvailable list of "big" and "small",
// allocated through "small". It returns the claim when it was prepared.
func (r *run) checkPrioritizedList(ctx context.Context) []*resourcev1.ResourceClaim {
	id := verify.CheckDRAPrioritizedList
	dev, lender := r.lend()
	if lender != "" {
		_, _ = r.unprepare(ctx, ref(r.claims[lender]))
		defer func() { _, _ = r.prepare(ctx, r.claims[lender]) }()
	}
	spec := resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
		Name: firstRequest, FirstAvailable: []resourcev1.DeviceSubRequest{
			{Name: "big", DeviceClassName: "dpkit-verify"},
			{Name: firstChosen, DeviceClassName: "dpkit-verify"},
		},
	}}}}
	result := firstRequest + "/" + firstChosen
	claim, err := r.writeClaim(ctx, firstAvailableRole, spec, []resourcev1.DeviceRequestAllocationResult{{
		Request: result, Driver: r.driver, Pool: r.pool, Device: dev,
	}})
	if err != nil {
		r.set(id, verify.Skip, "the claim could not be written: %v", err)
		return nil
	}
	res, timedOut, err := r.prepareAlone(ctx, claim)
	switch {
	case timedOut:
		r.set(id, verify.Skip, "see %s", verify.CheckDRATimeout)
		return nil
	case err != nil:
		r.set(id, verify.Fail, "%s, allocated device %s for request %s (subrequest %s of firstAvailable), was %v", firstAvailableRole, dev, result, firstChosen, err)
		return nil
	}
	defer func() { _, _ = r.unprepare(ctx, ref(claim)) }()
	devs := answered(res, r.pool, dev)
	switch problem := requestNameProblem(devs, firstRequest); {
	case len(devs) == 0:
		r.set(id, verify.Fail, "%s, allocated device %s/%s for request %s, was answered with %s, not its device", firstAvailableRole, r.pool, dev, result, deviceKey(res))
	case problem != "":
		r.set(id, verify.Fail, "%s, allocated device %s for request %s: %s", firstAvailableRole, dev, result, problem)
	default:
		names := "no request names (every container of the claim gets it)"
		if n := devs[0].GetRequestNames(); len(n) > 0 {
			names = fmt.Sprintf("request names %q", n)
		}
		r.set(id, verify.Pass, "%s, allocated device %s for request %s, prepared; the device answered under %s", firstAvailableRole, dev, result, names)
	}
	return []*resourcev1.ResourceClaim{claim}
}
