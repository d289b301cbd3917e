package draplugin

import (
	"context"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// Devices per ResourceSlice: the API's limits.
const (
	MaxDevicesPerSlice        = resourcev1.ResourceSliceMaxDevices
	MaxDevicesPerSliceTainted = resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures
)

// SplitDevices cuts devices into the slices they are published in: at most
// 128 devices per slice, 64 when a device has taints or consumes counters.
// An empty pool is one empty slice (the driver runs and has no devices).
func SplitDevices(devices []resourcev1.Device) [][]resourcev1.Device {
	per := MaxDevicesPerSlice
	for _, d := range devices {
		if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 {
			per = MaxDevicesPerSliceTainted
			break
		}
	}
	if len(devices) == 0 {
		return [][]resourcev1.Device{nil}
	}
	var out [][]resourcev1.Device
	for i := 0; i < len(devices); i += per {
		out = append(out, devices[i:min(i+per, len(devices))])
	}
	return out
}

// MaxCounterSetsPerSlice is how many counter sets one ResourceSlice may
// carry.
const MaxCounterSetsPerSlice = resourcev1.ResourceSliceMaxCounterSets

// Resources returns the ResourceSlices' content for a pool's devices and
// the counter sets they consume, as the helper's ResourceSlice controller
// takes it. Counter sets go in slices of their own, before the devices'
// (the API takes a slice of devices or of counter sets, never both, and
// the scheduler reads a pool's sets from all its slices).
func Resources(pool string, devices []resourcev1.Device, sets []resourcev1.CounterSet) resourceslice.DriverResources {
	var slices []resourceslice.Slice
	for i := 0; i < len(sets); i += MaxCounterSetsPerSlice {
		slices = append(slices, resourceslice.Slice{SharedCounters: sets[i:min(i+MaxCounterSetsPerSlice, len(sets))]})
	}
	if len(devices) > 0 || len(slices) == 0 {
		for _, devs := range SplitDevices(devices) {
			slices = append(slices, resourceslice.Slice{Devices: devs})
		}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{pool: {Slices: slices}}}
}

// SliceRepairDelay is how long after a change to one of its
// ResourceSlices made by someone else the driver writes them back. The
// kubelet deletes every ResourceSlice of its node as it starts (before
// any driver has registered again); with the library's default, 30 s,
// the node's devices would be invisible to the scheduler that long
// after every kubelet restart. One second is still long enough for the
// controller's informer to have seen the change.
const SliceRepairDelay = time.Second

// publishLoop hands the devices to a ResourceSlice controller
// (k8s.io/dynamic-resource-allocation/resourceslice, the one the
// kubeletplugin helper starts, but with SliceRepairDelay) once known and
// on every change that alters them. The controller owns the rest: slice
// names and generations, writing them with the Node as owner, putting
// back slices someone deleted or changed, retries, and fields the API
// server drops (HandleError).
func (d *Driver) publishLoop(ctx context.Context) {
	ch, stop := d.inv.Watch()
	defer stop()
	var ctrl *resourceslice.Controller
	defer func() {
		if ctrl != nil {
			ctrl.Stop()
		}
	}()
	var last []resourcev1.Device
	var lastSets []resourcev1.CounterSet
	for {
		devs, sets, known := d.sliceDevices()
		if known && (ctrl == nil || !apiequality.Semantic.DeepEqual(devs, last) || !apiequality.Semantic.DeepEqual(sets, lastSets)) {
			res := Resources(d.cfg.PoolName, devs, sets)
			if ctrl == nil {
				var err error
				ctrl, err = resourceslice.StartController(ctx, resourceslice.Options{
					DriverName: d.cfg.DriverName,
					KubeClient: d.cfg.Client,
					// The controller finds the Node's UID.
					Owner:     &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: d.cfg.NodeName},
					Resources: &res,
					SyncDelay: ptr.To(SliceRepairDelay),
					// Nothing the controller meets is cured by
					// restarting: it retries.
					ErrorHandler: func(ctx context.Context, err error, msg string) {
						d.HandleError(ctx, recoverable{err}, msg)
					},
				})
				if err != nil {
					// Only a controller without a client or driver fails
					// here, and New refuses those.
					d.log.Error("Publishing ResourceSlices failed", "err", err)
					ctrl = nil
				}
			} else {
				ctrl.Update(&res)
			}
			if ctrl != nil {
				d.metrics.publishes.Inc()
				d.log.Debug("ResourceSlices handed to the controller", "devices", len(devs))
				last, lastSets = devs, sets
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}

// recoverable marks an error of the ResourceSlice controller as one it
// retries, as the helper does for its own.
type recoverable struct{ error }

func (e recoverable) Unwrap() error { return e.error }

func (e recoverable) Is(target error) bool { return target == kubeletplugin.ErrRecoverable }
