package inventory

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Front names one of the APIs an inventory's devices are served through.
type Front string

const (
	// FrontDevicePlugin is the kubelet's device plugin API.
	FrontDevicePlugin Front = "deviceplugin"
	// FrontDRA is dynamic resource allocation.
	FrontDRA Front = "dra"
)

// DevicePluginOwner is the Owner of every device plugin hold: the kubelet's
// device manager decides which container gets a device, so the arbiter
// tells device plugin containers apart no further.
const DevicePluginOwner = "device plugin container"

// Holder is who holds a device: the front it was given out through and,
// within the front, its owner: a claim "namespace/name (uid)" for DRA,
// DevicePluginOwner for the device plugin front.
type Holder struct {
	Front Front
	Owner string
}

func (h Holder) String() string { return fmt.Sprintf("%s through the %s front", h.Owner, h.Front) }

// ClaimHolder returns the DRA holder of a claim.
func ClaimHolder(namespace, name, uid string) Holder {
	return Holder{Front: FrontDRA, Owner: fmt.Sprintf("ResourceClaim %s/%s (%s)", namespace, name, uid)}
}

// ErrHeld is wrapped by every ConflictError.
var ErrHeld = errors.New("device is held")

// ConflictError is Acquire's refusal: Device is held by Holder.
type ConflictError struct {
	Device string
	Holder Holder
}

func (e *ConflictError) Error() string {
	hint := "it is offered again once its holder releases it"
	switch e.Holder.Front {
	case FrontDRA:
		hint = "it is offered again once the claim is unprepared (its pods are gone)"
	case FrontDevicePlugin:
		hint = "it is offered again once the kubelet no longer lists it for any container"
	}
	return fmt.Sprintf("device %q is held by %s; %s", e.Device, e.Holder, hint)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *ConflictError) Unwrap() error { return ErrHeld }

// Acquire gives every device in ids to h, or none of them: when one is
// held by another holder it returns a *ConflictError naming the first such
// device and its holder. Acquiring a device h already holds succeeds.
func (inv *Inventory) Acquire(ids []string, h Holder) error {
	_, err := inv.acquire(ids, h)
	return err
}

// acquire is Acquire that also returns the IDs that were not held by h
// before.
func (inv *Inventory) acquire(ids []string, h Holder) ([]string, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	for _, id := range ids {
		if cur, ok := inv.holds[id]; ok && cur.Holder != h {
			return nil, &ConflictError{Device: id, Holder: cur.Holder}
		}
	}
	now := inv.opts.clock.Now()
	var added []string
	for _, id := range ids {
		cur, ok := inv.holds[id]
		if !ok {
			added = append(added, id)
			cur = hold{Holder: h}
		}
		// A new Allocate starts a new wait for the kubelet to record it.
		cur.acquired, cur.recorded = now, false
		inv.holds[id] = cur
	}
	if len(added) > 0 {
		inv.wakeLocked()
	}
	return added, nil
}

// Release frees every device h holds.
func (inv *Inventory) Release(h Holder) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	changed := false
	for id, cur := range inv.holds {
		if cur.Holder == h {
			delete(inv.holds, id)
			changed = true
		}
	}
	if changed {
		inv.wakeLocked()
	}
}

// releaseIDs frees the devices in ids that h holds.
func (inv *Inventory) releaseIDs(ids []string, h Holder) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	changed := false
	for _, id := range ids {
		if cur, ok := inv.holds[id]; ok && cur.Holder == h {
			delete(inv.holds, id)
			changed = true
		}
	}
	if changed {
		inv.wakeLocked()
	}
}

// HeldBy returns the holder of a device, and false when it is free.
func (inv *Inventory) HeldBy(id string) (Holder, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	cur, ok := inv.holds[id]
	return cur.Holder, ok
}

// Held returns the IDs of the devices held through front, sorted.
func (inv *Inventory) Held(front Front) []string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var out []string
	for id, cur := range inv.holds {
		if cur.Front == front {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// PodResourcesLister is the kubelet's PodResources API, as far as the
// inventory reads it; a podresourcesv1.PodResourcesListerClient is one.
type PodResourcesLister interface {
	List(ctx context.Context, in *podresourcesv1.ListPodResourcesRequest, opts ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error)
}

// Refresh brings the device plugin holds in line with what the kubelet
// lists for containers in its PodResources API: a listed device is held
// (also one allocated before this process started); a held device no
// longer listed is released once the kubelet has listed it before, or when
// the allocate grace has passed since its last Allocate (the kubelet
// recorded no container for it: the pod's admission failed). Without a
// PodResources API it does nothing and returns nil: holds stay.
//
// When the API fails, holds stay as they are. Refresh logs that once, at
// WARN, with what it means and the fix, and once at INFO when the API
// answers again; failures in between are DEBUG. Its error is for callers
// to act on, not to log again.
//
// A listed device held by a claim is left to the claim and logged: two
// users of one device is a conflict only a person can settle.
func (inv *Inventory) Refresh(ctx context.Context) error {
	if inv.opts.podResources == nil {
		return nil
	}
	inv.refreshMu.Lock()
	defer inv.refreshMu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, inv.opts.podResourcesCallBudget)
	defer cancel()
	resp, err := inv.opts.podResources.List(cctx, &podresourcesv1.ListPodResourcesRequest{})
	if ctx.Err() == nil {
		// A call cut short by its caller says nothing about the API.
		inv.podResourcesAnswered(err)
	}
	if err != nil {
		return fmt.Errorf("PodResources List: %w", err)
	}
	listed := make(map[string]bool)
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() != inv.resource {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					listed[id] = true
				}
			}
		}
	}
	inv.applyListed(listed)
	return nil
}

func (inv *Inventory) applyListed(listed map[string]bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	now := inv.opts.clock.Now()
	dp := Holder{Front: FrontDevicePlugin, Owner: DevicePluginOwner}
	changed := false
	for id := range listed {
		cur, ok := inv.holds[id]
		switch {
		case !ok:
			inv.holds[id] = hold{Holder: dp, acquired: now, recorded: true}
			changed = true
		case cur.Holder == dp:
			cur.recorded = true
			inv.holds[id] = cur
		default:
			inv.log.Error("The kubelet lists a device for a device plugin container that a claim holds; two users share it",
				"device", id, "holder", cur.String())
		}
	}
	for id, cur := range inv.holds {
		if cur.Holder != dp || listed[id] {
			continue
		}
		if cur.recorded || now.Sub(cur.acquired) >= inv.opts.grace {
			delete(inv.holds, id)
			changed = true
			inv.log.Debug("Device plugin hold released", "device", id, "recorded", cur.recorded)
		}
	}
	if changed {
		inv.wakeLocked()
	}
}

// podResourcesAnswered logs a change in how the PodResources API answers:
// a failure once (again only when it fails another way), its return once.
// refreshMu is held.
func (inv *Inventory) podResourcesAnswered(err error) {
	code := status.Code(err)
	was := inv.podResourcesDown
	inv.podResourcesDown = code
	switch {
	case code == was && code == codes.OK:
	case code == was:
		inv.log.Debug("The kubelet's PodResources API still does not answer; device plugin holds stay", "err", err)
	case code == codes.OK:
		inv.log.Info("The kubelet's PodResources API answers again; device plugin holds follow it")
	default:
		inv.log.Warn("The kubelet's PodResources API does not answer, so devices allocated through the device plugin API are not offered through DRA again until it does; said once, and again when it answers",
			"err", err,
			"fix", "make the kubelet's PodResources socket (in err) reachable from this process: in a pod, mount the host's /var/lib/kubelet/pod-resources; or point the plugin at the socket the kubelet serves")
	}
}
