package inventory

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// DevicePluginFront returns the plugin a deviceplugin.Server serves when
// the inventory's devices are also served through DRA. Its Scan follows
// the inventory (Run must be running) and leaves out the devices claims
// hold; its Allocate refuses a device a claim holds (codes.FailedPrecondition,
// naming the claim) and otherwise records a device plugin hold before
// calling the real plugin's Allocate. The real plugin's PreStarter passes
// through, and the front implements it only when the real plugin does.
//
// The front always answers GetPreferredAllocation: it steers the kubelet
// away from devices claims took since the kubelet last heard from Scan (a
// claim the scheduler just allocated, held from then on by a DRA front
// that follows allocated claims: draplugin.Config.Allocated), by asking
// the real plugin's PreferredAllocation with those left out of the
// devices available, or, for a plugin without one, packing the rest by
// NUMA node (deviceplugin.PackNUMA). Without it, the kubelet would give
// such a device to an extended-resource container and Allocate would
// refuse it, failing the pod.
func (inv *Inventory) DevicePluginFront() deviceplugin.Plugin {
	f := &front{inv: inv}
	if ps, ok := inv.plugin.(deviceplugin.PreStarter); ok {
		return struct {
			*front
			deviceplugin.PreStarter
		}{f, ps}
	}
	return f
}

// withOptional adds to f the optional interfaces real implements that
// pass through unchanged: PreferredAllocator and PreStarter.
func withOptional(f deviceplugin.Plugin, real deviceplugin.Plugin) deviceplugin.Plugin {
	pa, isPA := real.(deviceplugin.PreferredAllocator)
	ps, isPS := real.(deviceplugin.PreStarter)
	switch {
	case isPA && isPS:
		return struct {
			deviceplugin.Plugin
			deviceplugin.PreferredAllocator
			deviceplugin.PreStarter
		}{f, pa, ps}
	case isPA:
		return struct {
			deviceplugin.Plugin
			deviceplugin.PreferredAllocator
		}{f, pa}
	case isPS:
		return struct {
			deviceplugin.Plugin
			deviceplugin.PreStarter
		}{f, ps}
	}
	return f
}

// DevicePluginOnly returns the plugin a deviceplugin.Server serves when
// p is served through the device plugin API alone, so that the kubelet
// arbitrates and no inventory is needed: Scan leaves out what that API
// cannot offer, as DevicePluginFront does (a shared device that has
// replicas, which are offered instead, and a DRAOnly device); the rest
// passes through. A plugin that describes no sharing is returned as it is.
func DevicePluginOnly(p deviceplugin.Plugin) deviceplugin.Plugin {
	if _, ok := p.(deviceplugin.Describer); !ok {
		return p
	}
	return withOptional(dpOnly{p}, p)
}

type dpOnly struct{ deviceplugin.Plugin }

func (d dpOnly) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	return d.Plugin.Scan(ctx, func(devs []deviceplugin.Device) {
		l := readSharing(d.Plugin, devs)
		out := make([]deviceplugin.Device, 0, len(devs))
		for _, dev := range devs {
			if dpOnlyHides(&l, dev.ID) {
				continue
			}
			out = append(out, dev)
		}
		notify(out)
	})
}

type front struct{ inv *Inventory }

// Scan reports the inventory's devices less those claims hold, on every
// change of either, until ctx ends.
func (f *front) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	ch, stop := f.inv.Watch()
	defer stop()
	for {
		if devs, known := f.inv.devicePluginView(); known {
			notify(devs)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ch:
		}
	}
}

// devicePluginView is the snapshot less the devices the device plugin
// front could not be given now (offerableLocked).
func (inv *Inventory) devicePluginView() ([]deviceplugin.Device, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	out := make([]deviceplugin.Device, 0, len(inv.devices))
	for _, d := range inv.devices {
		if inv.offerableLocked(d.ID) {
			out = append(out, d)
		}
	}
	return out, inv.known
}

// offerableLocked says whether the device plugin front could be given id
// now: not when it is held through DRA, or its share or counters no
// longer fit beside what others hold. A device the front holds stays. A
// shared device with replicas is offered through its replicas only, and
// a DRAOnly device not at all. mu is held.
func (inv *Inventory) offerableLocked(id string) bool {
	dp := Holder{Front: FrontDevicePlugin, Owner: DevicePluginOwner}
	nh, isNew, err := inv.ledger.admit(inv.holds, Grant{Device: id}, dp)
	if err != nil {
		return false
	}
	held := !isNew && nh.Holder == dp
	if !held && inv.ledger.shared(id) && len(inv.ledger.children[id]) > 0 {
		return false
	}
	if s := inv.ledger.sharing[id]; !held && s != nil && s.DRAOnly {
		return false
	}
	return true
}

// PreferredAllocation answers the kubelet's GetPreferredAllocation from
// the devices in req.Available the front could be given now (see
// DevicePluginFront).
func (f *front) PreferredAllocation(ctx context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	f.inv.mu.Lock()
	free := make([]deviceplugin.Device, 0, len(req.Available))
	for _, d := range req.Available {
		if f.inv.offerableLocked(d.ID) {
			free = append(free, d)
		}
	}
	f.inv.mu.Unlock()
	req.Available = free
	if pa, ok := f.inv.plugin.(deviceplugin.PreferredAllocator); ok {
		return pa.PreferredAllocation(ctx, req)
	}
	return deviceplugin.PackNUMA(req), nil
}

// Allocate holds the devices for the device plugin front, then asks the
// real plugin; when that fails, the holds it took are released.
func (f *front) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	dp := Holder{Front: FrontDevicePlugin, Owner: DevicePluginOwner}
	added, err := f.inv.acquire(grantsOf(ids), dp)
	if err != nil {
		var ce *ConflictError
		if errors.As(err, &ce) {
			return nil, status.Error(codes.FailedPrecondition, "device plugin Allocate refused: "+err.Error())
		}
		return nil, err
	}
	resp, err := f.inv.plugin.Allocate(ctx, ids)
	if err != nil {
		f.inv.releaseGrants(added, dp)
		return nil, err
	}
	return resp, nil
}
