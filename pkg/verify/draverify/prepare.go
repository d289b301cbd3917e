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
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/verify"
)

// noSuchDevice is the device of the claim that cannot be prepared.
const noSuchDevice = "dpkit-verify-no-such-device"

// newClaim creates a claim allocated to device of the driver's pool and
// reserved for verify's pod; with admin, its request and allocation
// result have adminAccess, as the scheduler writes them.
func (r *run) newClaim(ctx context.Context, role, device string, admin bool) (*resourcev1.ResourceClaim, error) {
	return r.newClaimIn(ctx, role, r.pool, device, admin)
}

// newClaimIn is newClaim with the device in pool (an allocation cannot
// be changed once written).
func (r *run) newClaimIn(ctx context.Context, role, pool, device string, admin bool) (*resourcev1.ResourceClaim, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	var adminAccess *bool
	if admin {
		adminAccess = ptr.To(true)
	}
	c := &resourcev1.ResourceClaim{
		ObjectMeta: r.sb.meta(role, r.ns),
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "req", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "dpkit-verify", AdminAccess: adminAccess},
		}}}},
	}
	c, err := r.client.ResourceV1().ResourceClaims(r.ns).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create ResourceClaim %s/%s: %w", r.ns, role, err)
	}
	r.created = append(r.created, c.Name)
	c.Status = resourcev1.ResourceClaimStatus{
		Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "req", Driver: r.driver, Pool: pool, Device: device, AdminAccess: adminAccess,
		}}}},
		ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "dpkit-verify", UID: r.podUID}},
	}
	c, err = r.client.ResourceV1().ResourceClaims(r.ns).UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("allocate ResourceClaim %s/%s: %w", r.ns, role, err)
	}
	return c, nil
}

// allowAdminAccess labels the run's namespace so that the API server
// accepts claims with admin access in it (resource.k8s.io/v1
// DRAAdminNamespaceLabelKey: the registry refuses adminAccess in a
// claim's spec or allocation otherwise).
func (r *run) allowAdminAccess(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{%q:"true"}}}`, resourcev1.DRAAdminNamespaceLabelKey)
	if _, err := r.client.CoreV1().Namespaces().Patch(ctx, r.ns, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("label Namespace %s %s=true for a claim with admin access: %w", r.ns, resourcev1.DRAAdminNamespaceLabelKey, err)
	}
	return nil
}

func ref(c *resourcev1.ResourceClaim) *drav1.Claim {
	return &drav1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}

// errTimedOut marks a call that ran out of the prepare timeout.
var errTimedOut = errors.New("timed out")

// timed runs one call with the kubelet's deadline and records how long it
// took.
func (r *run) timed(ctx context.Context, what string, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.PrepareTimeout)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	if d := time.Since(start); d > r.slowest {
		r.slowest, r.slowestCall = d, what
	}
	// gRPC's own timer for the deadline can end the call a moment before
	// the context records it: the clock decides.
	if deadline, _ := ctx.Deadline(); ctx.Err() == context.DeadlineExceeded || (err != nil && !time.Now().Before(deadline)) {
		return fmt.Errorf("%s %w after %s (see %s)", what, errTimedOut, r.cfg.PrepareTimeout, verify.CheckDRATimeout)
	}
	return err
}

func (r *run) prepare(ctx context.Context, claims ...*resourcev1.ResourceClaim) (*drav1.NodePrepareResourcesResponse, error) {
	req := &drav1.NodePrepareResourcesRequest{}
	var names []string
	for _, c := range claims {
		req.Claims = append(req.Claims, ref(c))
		names = append(names, c.Name)
	}
	var resp *drav1.NodePrepareResourcesResponse
	err := r.timed(ctx, "NodePrepareResources("+strings.Join(names, ",")+")", func(ctx context.Context) (err error) {
		resp, err = r.plugin.NodePrepareResources(ctx, req)
		return err
	})
	return resp, err
}

func (r *run) unprepare(ctx context.Context, claims ...*drav1.Claim) (*drav1.NodeUnprepareResourcesResponse, error) {
	var resp *drav1.NodeUnprepareResourcesResponse
	err := r.timed(ctx, "NodeUnprepareResources", func(ctx context.Context) (err error) {
		resp, err = r.plugin.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims})
		return err
	})
	return resp, err
}

// deviceKey sums up a claim's prepared devices for comparison.
func deviceKey(res *drav1.NodePrepareResourceResponse) string {
	var out []string
	for _, d := range res.GetDevices() {
		ids := slices.Clone(d.CdiDeviceIds)
		sort.Strings(ids)
		out = append(out, d.PoolName+"/"+d.DeviceName+"="+strings.Join(ids, ","))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

func (r *run) checkPrepare(ctx context.Context) bool {
	roles := []struct {
		role, device string
		admin        bool
	}{
		{"claim-a", r.devices[0], false}, {"claim-b", r.devices[len(r.devices)-1], false},
		{"claim-missing", noSuchDevice, false}, {"claim-shared", r.devices[0], false},
		{"claim-admin", r.devices[0], true},
	}
	r.claims = map[string]*resourcev1.ResourceClaim{}
	for _, c := range roles {
		if c.admin {
			if err := r.allowAdminAccess(ctx); err != nil {
				r.set(verify.CheckDRASharedDevice, verify.Skip, "%v", err)
				continue
			}
		}
		claim, err := r.newClaim(ctx, c.role, c.device, c.admin)
		if c.admin && err != nil {
			r.set(verify.CheckDRASharedDevice, verify.Skip, "%v", err)
			continue
		}
		if err != nil {
			return r.stop("the claims could not be written: " + err.Error())
		}
		r.claims[c.role] = claim
	}
	a, b := r.claims["claim-a"], r.claims["claim-b"]
	twoClaims := []*resourcev1.ResourceClaim{a}
	if b.Status.Allocation.Devices.Results[0].Device != a.Status.Allocation.Devices.Results[0].Device {
		twoClaims = append(twoClaims, b)
	}
	// One result per claim, with the allocated device.
	resp, err := r.prepare(ctx, twoClaims...)
	if err != nil && errors.Is(err, errTimedOut) {
		// One cause, one failure: dra.prepare.timeout judges it.
		r.set(verify.CheckDRAPrepare, verify.Skip, "%v", err)
		r.skipDependent("see "+verify.CheckDRATimeout, verify.CheckDRAIdempotent, verify.CheckDRACDI, verify.CheckDRAReboot, verify.CheckDRASharedDevice)
	} else if err != nil {
		r.set(verify.CheckDRAPrepare, verify.Fail, "%v", err)
		r.skipDependent("see "+verify.CheckDRAPrepare, verify.CheckDRAIdempotent, verify.CheckDRACDI, verify.CheckDRAReboot, verify.CheckDRASharedDevice)
	} else {
		var problems []string
		for _, c := range twoClaims {
			res, ok := resp.Claims[string(c.UID)]
			dev := c.Status.Allocation.Devices.Results[0].Device
			switch {
			case !ok:
				problems = append(problems, fmt.Sprintf("no result for claim %s (UID %s)", c.Name, c.UID))
			case res.Error != "":
				problems = append(problems, fmt.Sprintf("claim %s (device %s): %s", c.Name, dev, res.Error))
			case !slices.ContainsFunc(res.Devices, func(d *drav1.Device) bool { return d.DeviceName == dev && d.PoolName == r.pool }):
				problems = append(problems, fmt.Sprintf("claim %s: the result names %s, not the allocated device %s/%s", c.Name, deviceKey(res), r.pool, dev))
			}
		}
		if extra := len(resp.Claims) - len(twoClaims); extra > 0 {
			problems = append(problems, fmt.Sprintf("%d result(s) for claims not asked for", extra))
		}
		if len(problems) > 0 {
			r.set(verify.CheckDRAPrepare, verify.Fail, "%s", strings.Join(problems, "; "))
			r.skipDependent("see "+verify.CheckDRAPrepare, verify.CheckDRAIdempotent, verify.CheckDRACDI, verify.CheckDRAReboot, verify.CheckDRASharedDevice)
		} else {
			r.prepared = resp.Claims
			r.set(verify.CheckDRAPrepare, verify.Pass, "%d claims, %d results: %s", len(twoClaims), len(resp.Claims), deviceKey(resp.Claims[string(a.UID)]))
		}
	}
	if r.prepared != nil {
		r.checkCDI(verify.CheckDRACDI, r.prepared)
		again, err := r.prepare(ctx, a)
		first := deviceKey(r.prepared[string(a.UID)])
		switch {
		case err != nil:
			r.set(verify.CheckDRAIdempotent, verify.Fail, "preparing claim-a again: %v", err)
		case again.Claims[string(a.UID)] == nil:
			r.set(verify.CheckDRAIdempotent, verify.Fail, "preparing claim-a again gave no result for it")
		case again.Claims[string(a.UID)].Error != "":
			r.set(verify.CheckDRAIdempotent, verify.Fail, "preparing claim-a again: %s", again.Claims[string(a.UID)].Error)
		case deviceKey(again.Claims[string(a.UID)]) != first:
			r.set(verify.CheckDRAIdempotent, verify.Fail, "preparing claim-a again gave %s, first %s", deviceKey(again.Claims[string(a.UID)]), first)
		default:
			r.set(verify.CheckDRAIdempotent, verify.Pass, "the same devices again: %s", first)
		}
	}
	r.checkPerClaimError(ctx)
	r.checkShared(ctx)
	r.checkUnknownClaim(ctx)
	return true
}

// checkPerClaimError prepares a claim that cannot be prepared beside one
// that can.
func (r *run) checkPerClaimError(ctx context.Context) {
	a, missing := r.claims["claim-a"], r.claims["claim-missing"]
	resp, err := r.prepare(ctx, missing, a)
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(verify.CheckDRAPerClaimError, verify.Skip, "%v", err)
	case err != nil:
		r.set(verify.CheckDRAPerClaimError, verify.Fail, "the whole call failed for one claim allocated to a device the driver does not have (%s): %v", noSuchDevice, err)
	case resp.Claims[string(missing.UID)] == nil || resp.Claims[string(missing.UID)].Error == "":
		r.set(verify.CheckDRAPerClaimError, verify.Fail, "claim-missing, allocated to device %s the driver does not publish, got no error", noSuchDevice)
	case r.prepared != nil && (resp.Claims[string(a.UID)] == nil || resp.Claims[string(a.UID)].Error != ""):
		r.set(verify.CheckDRAPerClaimError, verify.Fail, "claim-a failed beside claim-missing: %v", resp.Claims[string(a.UID)])
	default:
		r.set(verify.CheckDRAPerClaimError, verify.Pass, "claim-missing: %q; claim-a prepared", resp.Claims[string(missing.UID)].Error)
	}
}

// checkShared prepares claim-a's device, while claim-a holds it, for two
// claims more. claim-admin's allocation result has adminAccess: the
// scheduler allocates a held device so (it leaves admin-access results
// out of the devices in use) and the kubelet prepares such a claim like
// any other, so a driver must prepare it. claim-shared has no admin
// access: the scheduler never allocates a held device so unless the
// device allows multiple allocations; the kubelet does not look, so a
// driver that prepares it is told, not failed.
func (r *run) checkShared(ctx context.Context) {
	if r.prepared == nil || r.decided(verify.CheckDRASharedDevice) {
		return
	}
	dev := r.devices[0]
	admin, shared := r.claims["claim-admin"], r.claims["claim-shared"]
	resp, err := r.prepare(ctx, admin)
	res := resp.GetClaims()[string(admin.UID)]
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(verify.CheckDRASharedDevice, verify.Skip, "%v", err)
	case err != nil:
		r.set(verify.CheckDRASharedDevice, verify.Fail, "claim-admin, allocated device %s with adminAccess while claim-a holds it, failed the whole call: %v", dev, err)
	case res == nil:
		r.set(verify.CheckDRASharedDevice, verify.Fail, "no result for claim-admin (allocated device %s with adminAccess while claim-a holds it)", dev)
	case res.Error != "":
		r.set(verify.CheckDRASharedDevice, verify.Fail, "claim-admin, allocated device %s with adminAccess while claim-a holds it, was refused: %s", dev, res.Error)
	}
	_, _ = r.unprepare(ctx, ref(admin))
	if r.decided(verify.CheckDRASharedDevice) {
		return
	}
	resp, err = r.prepare(ctx, shared)
	res = resp.GetClaims()[string(shared.UID)]
	const adminOK = "claim-admin (adminAccess) prepared on device %s beside claim-a; "
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(verify.CheckDRASharedDevice, verify.Skip, "%v", err)
	case err != nil:
		r.set(verify.CheckDRASharedDevice, verify.Pass, adminOK+"claim-shared (no admin access) refused for the whole call: %v", dev, err)
	case res != nil && res.Error != "":
		r.set(verify.CheckDRASharedDevice, verify.Pass, adminOK+"claim-shared (no admin access) refused: %s", dev, res.Error)
	case r.sharable(ctx, dev):
		r.set(verify.CheckDRASharedDevice, verify.Pass, adminOK+"claim-shared (no admin access) prepared too: the device allows multiple allocations", dev)
	default:
		r.set(verify.CheckDRASharedDevice, verify.Warn, adminOK+"claim-shared, without admin access, was prepared on it too: the scheduler never allocates that, and a driver is the last line of defense against it (kubeletplugin's PrepareResourceClaims contract)", dev)
	}
	_, _ = r.unprepare(ctx, ref(shared))
}

// checkUnknownClaim unprepares a claim never prepared.
func (r *run) checkUnknownClaim(ctx context.Context) {
	unknown := &drav1.Claim{Namespace: r.ns, Name: "never-prepared", Uid: "dpkit-verify-" + rand.String(10)}
	uresp, err := r.unprepare(ctx, unknown)
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(verify.CheckDRAUnknownClaim, verify.Skip, "%v", err)
	case err != nil:
		r.set(verify.CheckDRAUnknownClaim, verify.Fail, "%v", err)
	case uresp.Claims[unknown.Uid] == nil:
		r.set(verify.CheckDRAUnknownClaim, verify.Fail, "no result for the claim")
	case uresp.Claims[unknown.Uid].Error != "":
		r.set(verify.CheckDRAUnknownClaim, verify.Fail, "%s", uresp.Claims[unknown.Uid].Error)
	default:
		r.set(verify.CheckDRAUnknownClaim, verify.Pass, "UID %s: no error", unknown.Uid)
	}
}

// sharable reports whether the slices mark device as allowing multiple
// allocations.
func (r *run) sharable(ctx context.Context, device string) bool {
	sl, err := r.slicesNow(ctx)
	if err != nil {
		return false
	}
	for _, s := range sl {
		for _, d := range s.Spec.Devices {
			if d.Name == device && s.Spec.Pool.Name == r.pool && d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
				return true
			}
		}
	}
	return false
}

func (r *run) skipDependent(reason string, ids ...string) {
	for _, id := range ids {
		if !r.decided(id) {
			r.set(id, verify.Skip, "%s", reason)
		}
	}
}

// checkCDI judges that every CDI ID of prepared is defined in a spec file
// of the CDI directory.
func (r *run) checkCDI(id string, prepared map[string]*drav1.NodePrepareResourceResponse) {
	var ids []string
	for _, res := range prepared {
		for _, d := range res.GetDevices() {
			ids = append(ids, d.CdiDeviceIds...)
		}
	}
	sort.Strings(ids)
	if len(ids) == 0 {
		r.set(id, verify.Skip, "the driver returned no CDI device IDs")
		return
	}
	defined := map[string]bool{}
	var problems []string
	entries, _ := os.ReadDir(r.cdiDir)
	for _, e := range entries {
		ext := filepath.Ext(e.Name())
		if e.IsDir() || (ext != ".json" && ext != ".yaml") {
			continue
		}
		spec, err := readSpec(filepath.Join(r.cdiDir, e.Name()))
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", e.Name(), err))
			continue
		}
		for _, d := range spec.Devices {
			defined[spec.Kind+"="+d.Name] = true
		}
	}
	for _, cid := range ids {
		if !defined[cid] {
			problems = append(problems, fmt.Sprintf("%s is in no CDI spec file of %s", cid, r.cdiDir))
		}
	}
	if len(problems) > 0 {
		r.set(id, verify.Fail, "%s", strings.Join(problems, "; "))
		return
	}
	r.set(id, verify.Pass, "%d CDI ID(s) defined in %d spec file(s): %s", len(ids), len(entries), strings.Join(ids, ", "))
}

// checkReboot prepares claim-a again after the simulated reboot.
func (r *run) checkReboot(ctx context.Context) {
	if r.decided(verify.CheckDRAReboot) || r.prepared == nil {
		if !r.decided(verify.CheckDRAReboot) {
			r.set(verify.CheckDRAReboot, verify.Skip, "see %s", verify.CheckDRAPrepare)
		}
		return
	}
	if r.results[verify.CheckDRACDI].Verdict == verify.Fail {
		// One cause, one failure: a spec missing or broken before the
		// reboot is missing or broken after it too.
		r.set(verify.CheckDRAReboot, verify.Skip, "see %s", verify.CheckDRACDI)
		return
	}
	a := r.claims["claim-a"]
	resp, err := r.prepare(ctx, a)
	switch {
	case err != nil && errors.Is(err, errTimedOut):
		r.set(verify.CheckDRAReboot, verify.Skip, "%v", err)
	case err != nil:
		r.set(verify.CheckDRAReboot, verify.Fail, "preparing claim-a after the reboot: %v", err)
	case resp.Claims[string(a.UID)] == nil || resp.Claims[string(a.UID)].Error != "":
		r.set(verify.CheckDRAReboot, verify.Fail, "preparing claim-a after the reboot: %v", resp.Claims[string(a.UID)])
	default:
		r.checkCDI(verify.CheckDRAReboot, map[string]*drav1.NodePrepareResourceResponse{string(a.UID): resp.Claims[string(a.UID)]})
		if res := r.results[verify.CheckDRAReboot]; res.Verdict == verify.Fail {
			res.Detail = "after the CDI directory was emptied and the driver restarted: " + res.Detail
		}
	}
}

// readSpec reads a CDI spec file the way a container runtime does: strict
// YAML (JSON is YAML), a version, a valid kind and device names.
func readSpec(path string) (*cdispec.Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec cdispec.Spec
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return nil, fmt.Errorf("does not parse as a CDI spec: %w", err)
	}
	if spec.Version == "" {
		return nil, errors.New("no cdiVersion")
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return nil, fmt.Errorf("kind %q: %w", spec.Kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return nil, fmt.Errorf("kind %q: %w", spec.Kind, err)
	}
	for _, d := range spec.Devices {
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return nil, fmt.Errorf("device %q: %w", d.Name, err)
		}
	}
	return &spec, nil
}
