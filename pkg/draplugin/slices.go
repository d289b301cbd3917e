package draplugin

import (
	"context"

	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
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

// publishLoop hands the devices to the helper's ResourceSlice controller
// once known and on every change that alters them. The controller owns
// the rest: slice names and generations, writing them with the Node as
// owner, putting back slices someone deleted or changed, retries, and
// fields the API server drops (HandleError).
func (d *Driver) publishLoop(ctx context.Context, h *kubeletplugin.Helper) {
	ch, stop := d.inv.Watch()
	defer stop()
	var last []resourcev1.Device
	var lastSets []resourcev1.CounterSet
	published := false
	for {
		devs, sets, known := d.sliceDevices()
		if known && (!published || !apiequality.Semantic.DeepEqual(devs, last) || !apiequality.Semantic.DeepEqual(sets, lastSets)) {
			if err := h.PublishResources(ctx, Resources(d.cfg.PoolName, devs, sets)); err != nil {
				// Only a helper without a node name fails here, and
				// New refuses that.
				d.log.Error("Publishing ResourceSlices failed", "err", err)
			} else {
				d.metrics.publishes.Inc()
				d.log.Debug("ResourceSlices handed to the controller", "devices", len(devs))
				last, lastSets, published = devs, sets, true
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
	}
}
