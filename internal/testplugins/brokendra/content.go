package main

import (
	"context"
	"fmt"
	"log"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

// What the driver publishes and prepares besides its plain devices, for
// the checks of what real drivers get wrong there: a second pool (the
// node's name with "-parts") of partitionable devices, part-0a and
// part-0b, each consuming half of counter set chip-0 (KEP-4815), and
// shared-0, a device that allows multiple allocations with a bandwidth
// capacity to share (KEP-5075); the status it writes in the claims it
// prepares (KEP-4817); request names without the subrequest of a
// prioritized list (KEP-4816); CDI device names and versions.

// Devices of the parts pool.
const (
	counterSet   = "chip-0"
	sharedDevice = "shared-0"
)

var partDevices = []string{"part-0a", "part-0b", sharedDevice}

func (d *driver) partsPool() string { return d.node + "-parts" }

// known tells whether pool/device is one of the driver's devices.
func (d *driver) known(pool, device string) bool {
	return (pool == d.node && slices.Contains(devices, device)) || (pool == d.partsPool() && slices.Contains(partDevices, device))
}

// sharable tells whether a result may share its device with other
// claims: shared-0 allows multiple allocations (but in refuse-shares).
func (d *driver) sharable(res resourcev1.DeviceRequestAllocationResult) bool {
	return res.Pool == d.partsPool() && res.Device == sharedDevice && d.mode != "refuse-shares"
}

// requestName is the request a device is answered under: the request of
// its allocation result without the subrequest of a prioritized list (in
// keep-subrequest, as it is).
func (d *driver) requestName(request string) string {
	if d.mode == "keep-subrequest" {
		return request
	}
	base, _, _ := strings.Cut(request, "/")
	return base
}

// cdiID is the CDI device ID of a claim's device: named after the claim
// (in cdi-device-names, after the device only, so that two claims of one
// device define it twice).
func (d *driver) cdiID(uid, device string) string {
	if d.mode == "cdi-device-names" {
		return cdiKind + "=" + device
	}
	return cdiKind + "=" + uid + "-" + device
}

// cdiVersion is the cdiVersion of the specs: 0.6.0, the lowest that
// allows annotations; old-cdi-version declares 0.5.0 with them.
func (d *driver) cdiVersion() string {
	switch d.mode {
	case "bad-cdi-spec":
		return ""
	case "old-cdi-version":
		return "0.5.0"
	}
	return "0.6.0"
}

// cdiAnnotations are the annotations of a claim's CDI device.
func cdiAnnotations(uid string) map[string]string {
	return map[string]string{"dpkit.io/claim": uid}
}

// answer turns an allocation result into the device answered for it,
// with the result's share (in no-share-id, without).
func (d *driver) answer(uid string, res resourcev1.DeviceRequestAllocationResult) *drav1.Device {
	dev := &drav1.Device{
		RequestNames: []string{d.requestName(res.Request)}, PoolName: res.Pool, DeviceName: res.Device,
		CdiDeviceIds: []string{d.cdiID(uid, res.Device)}, ShareId: (*string)(res.ShareID),
	}
	if d.mode == "no-share-id" {
		dev.ShareId = nil
	}
	return dev
}

// publishParts writes the parts pool once: a slice of its counter set
// and one of its devices, both for the node and owned by it.
func (d *driver) publishParts(ctx context.Context, node *corev1.Node) error {
	q := resource.MustParse
	consumedSet := counterSet
	if d.mode == "bad-counters" {
		consumedSet = "chip-9"
	}
	def := q("1Gi")
	if d.mode == "bad-request-policy" {
		def = q("20Gi") // above the capacity, and no validRange max to catch it
	}
	consume := func(set string) []resourcev1.DeviceCounterConsumption {
		return []resourcev1.DeviceCounterConsumption{{CounterSet: set, Counters: map[string]resourcev1.Counter{"memory": {Value: q("4Gi")}}}}
	}
	specs := []resourcev1.ResourceSliceSpec{
		{SharedCounters: []resourcev1.CounterSet{{Name: counterSet, Counters: map[string]resourcev1.Counter{"memory": {Value: q("8Gi")}}}}},
		{Devices: []resourcev1.Device{
			{Name: "part-0a", ConsumesCounters: consume(counterSet)},
			{Name: "part-0b", ConsumesCounters: consume(consumedSet)},
			{Name: sharedDevice, AllowMultipleAllocations: ptr.To(true), Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
				"bandwidth": {Value: q("10Gi"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
					Default: &def, ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: ptr.To(q("1Gi")), Step: ptr.To(q("1Gi"))},
				}},
			}},
		}},
	}
	for i, spec := range specs {
		name := []string{d.node + "-broken-counters", d.node + "-broken-parts"}[i]
		spec.Driver, spec.NodeName = driverName, &d.node
		spec.Pool = resourcev1.ResourcePool{Name: d.partsPool(), Generation: 1, ResourceSliceCount: int64(len(specs))}
		s := &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}},
			Spec:       spec,
		}
		// Published once: started again, the driver finds them.
		if _, err := d.client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publish %s: %w", name, err)
		}
	}
	return nil
}

// writeStatus writes the status of the claim's devices (its allocation's
// results of the driver) in its status.devices: Ready, and the network interface the driver "set
// up" (in bad-device-status an IP without its prefix length, which the
// API server refuses). A write that fails is logged: the claim is
// prepared all the same.
func (d *driver) writeStatus(ctx context.Context, claim *resourcev1.ResourceClaim) {
	ip := "10.0.0.1/24"
	if d.mode == "bad-device-status" {
		ip = "10.0.0.1"
	}
	claims := d.client.ResourceV1().ResourceClaims(claim.Namespace)
	cur := claim
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		if cur == nil {
			if cur, err = claims.Get(ctx, claim.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		cur = cur.DeepCopy()
		for _, res := range claim.Status.Allocation.Devices.Results {
			if res.Driver != driverName {
				continue
			}
			e := resourcev1.AllocatedDeviceStatus{
				Driver: driverName, Pool: res.Pool, Device: res.Device, ShareID: (*string)(res.ShareID),
				Conditions:  []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared", LastTransitionTime: metav1.Now()}},
				NetworkData: &resourcev1.NetworkDeviceData{InterfaceName: "brk0", IPs: []string{ip}, HardwareAddress: "02:00:00:00:00:01"},
			}
			cur.Status.Devices = slices.DeleteFunc(cur.Status.Devices, func(o resourcev1.AllocatedDeviceStatus) bool {
				return o.Driver == e.Driver && o.Pool == e.Pool && o.Device == e.Device && ptr.Deref(o.ShareID, "") == ptr.Deref(e.ShareID, "")
			})
			cur.Status.Devices = append(cur.Status.Devices, e)
		}
		_, err = claims.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			cur = nil
		}
		return err
	})
	if err != nil {
		log.Printf("Write the status of claim %s/%s: %v", claim.Namespace, claim.Name, err)
	}
}

// healthExtra are the devices the health stream reports besides the
// published ones: in health-extra-device one the driver does not
// publish.
func (d *driver) healthExtra() []string {
	if d.mode == "health-extra-device" {
		return []string{"dev-9"}
	}
	return nil
}
