package draverify

import (
	"context"
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// What real drivers get wrong in what they publish and prepare, past the
// plain Prepare checks: the CDI specs they write (cdispec.go), the
// request names of a prioritized list (prioritized.go), shares of a
// device with consumable capacity (capacity.go), the status they write
// in claims (claimstatus.go), and the counters of partitionable devices
// (partitions.go). They run as one step after the Prepare checks, while
// claim-a and claim-b are prepared.

// checkContent is that step.
func (r *run) checkContent(ctx context.Context) bool {
	sl, err := r.slicesNow(ctx)
	if err != nil {
		err = fmt.Errorf("listing the ResourceSlices: %w", err)
	}
	r.checkPartitions(sl, err)
	// The checks that prepare claims of their own need a driver that
	// prepares plain ones: one cause, one failure.
	if v := r.results[verify.CheckDRAPrepare].Verdict; v != verify.Pass || r.prepared == nil {
		reason := "see " + verify.CheckDRAPrepare
		if v == verify.Skip {
			reason = r.results[verify.CheckDRAPrepare].Detail
		}
		r.skipDependent(reason, verify.CheckDRACDIValid, verify.CheckDRACDIUnique, verify.CheckDRAPrioritizedList, verify.CheckDRAClaimStatus)
		r.checkConsumableCapacity(ctx, sl, err, reason)
		return true
	}
	r.checkCDIValid()
	r.checkCDIUnique(ctx)
	first := r.checkPrioritizedList(ctx)
	shares := r.checkConsumableCapacity(ctx, sl, err, "")
	r.checkClaimStatus(ctx, append(first, shares...))
	return true
}

// writeClaim creates claim role with spec in the run's namespace and
// allocates it results, reserved for verify's pod, as the scheduler
// writes them.
func (r *run) writeClaim(ctx context.Context, role string, spec resourcev1.ResourceClaimSpec, results []resourcev1.DeviceRequestAllocationResult) (*resourcev1.ResourceClaim, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	c, err := r.client.ResourceV1().ResourceClaims(r.ns).Create(ctx, &resourcev1.ResourceClaim{ObjectMeta: r.sb.meta(role, r.ns), Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create ResourceClaim %s/%s: %w", r.ns, role, err)
	}
	r.created = append(r.created, c.Name)
	c.Status = resourcev1.ResourceClaimStatus{
		Allocation:  &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: results}},
		ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "dpkit-verify", UID: r.podUID}},
	}
	c, err = r.client.ResourceV1().ResourceClaims(r.ns).UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("allocate ResourceClaim %s/%s: %w", r.ns, role, err)
	}
	return c, nil
}

// prepareAlone prepares claim alone and returns its result; a refusal of
// the claim is an error too. timedOut tells a call that ran out of the
// prepare timeout, which dra.prepare.timeout judges.
func (r *run) prepareAlone(ctx context.Context, c *resourcev1.ResourceClaim) (res *drav1.NodePrepareResourceResponse, timedOut bool, err error) {
	resp, err := r.prepare(ctx, c)
	switch {
	case err != nil:
		return nil, errors.Is(err, errTimedOut), fmt.Errorf("the whole call failed: %w", err)
	case resp.GetClaims()[string(c.UID)] == nil:
		return nil, false, errors.New("no result for it")
	case resp.Claims[string(c.UID)].Error != "":
		return nil, false, fmt.Errorf("refused: %s", resp.Claims[string(c.UID)].Error)
	}
	return resp.Claims[string(c.UID)], false, nil
}

// answered lists the devices of an answer that are pool/device.
func answered(res *drav1.NodePrepareResourceResponse, pool, device string) []*drav1.Device {
	var out []*drav1.Device
	for _, d := range res.GetDevices() {
		if d.GetPoolName() == pool && d.GetDeviceName() == device {
			out = append(out, d)
		}
	}
	return out
}
