package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

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

// ConflictError is the arbiter's refusal of a grant of Device: it is held
// by Holder (the first of Holders), or, when Reason is set, what it takes
// no longer fits beside what Holders hold (Reason says what is left).
type ConflictError struct {
	Device  string
	Holder  Holder
	Holders []Holder
	Reason  string
}

func (e *ConflictError) Error() string {
	hint := "it is offered again once its holder releases it"
	switch e.Holder.Front {
	case FrontDRA:
		hint = "it is offered again once the claim is unprepared (its pods are gone)"
	case FrontDevicePlugin:
		hint = "it is offered again once the kubelet no longer lists it for any container"
	}
	by := e.Holder.String()
	if len(e.Holders) > 1 {
		names := make([]string, len(e.Holders))
		for i, h := range e.Holders {
			names[i] = h.String()
		}
		by = strings.Join(names, ", ")
		hint = "it is offered again once enough of them release what they hold"
	}
	if e.Reason != "" {
		return fmt.Sprintf("device %q does not fit: %s; held by %s; %s", e.Device, e.Reason, by, hint)
	}
	return fmt.Sprintf("device %q is held by %s; %s", e.Device, by, hint)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *ConflictError) Unwrap() error { return ErrHeld }

// Grant is one device given to a holder: the whole device, or one share
// of a shared device (deviceplugin.Sharing).
type Grant struct {
	// Device is the device's ID.
	Device string `json:"device"`
	// ShareID tells apart the shares one holder holds of one shared
	// device: DRA's shareID. Empty for a whole device.
	ShareID string `json:"shareID,omitempty"`
	// Amounts is what a share asks of the device's shared capacities;
	// one not asked takes its default, and each is rounded up to the
	// capacity's granule. Ignored for a device that is not shared.
	Amounts map[string]int64 `json:"amounts,omitempty"`
}

// Acquire gives every device in ids to h, or none of them: when one is
// held by another holder, or what it takes no longer fits, it returns a
// *ConflictError naming the device and its holders. A shared device is
// given as a share of its default amounts. Acquiring a device h already
// holds succeeds. Before Scan's first report a share is taken as given
// (a checkpoint's), and judged by the rules once they come.
func (inv *Inventory) Acquire(ids []string, h Holder) error {
	_, err := inv.acquire(grantsOf(ids), h)
	return err
}

// AcquireGrants is Acquire for grants: shares of shared devices, with the
// amounts they take.
func (inv *Inventory) AcquireGrants(gs []Grant, h Holder) error {
	_, err := inv.acquire(gs, h)
	return err
}

func grantsOf(ids []string) []Grant {
	gs := make([]Grant, len(ids))
	for i, id := range ids {
		gs[i] = Grant{Device: id}
	}
	return gs
}

// acquire is AcquireGrants that also returns the grants that h did not
// hold before.
func (inv *Inventory) acquire(gs []Grant, h Holder) ([]Grant, error) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	// Each grant is judged beside the holds and the grants before it in
	// gs, on a copy that replaces the holds only when all fit.
	next := make(map[string][]hold, len(inv.holds)+len(gs))
	for id, hs := range inv.holds {
		next[id] = hs
	}
	now := inv.opts.clock.Now()
	var added []Grant
	for _, g := range gs {
		nh, isNew, err := inv.ledger.admit(next, g, h)
		if !inv.known && g.ShareID != "" {
			// Before the first snapshot there are no rules to judge a
			// share by: one acquired then is what a driver's checkpoint
			// says was given out. Its amounts are set when the rules
			// come. A whole device is held by one holder, as ever.
			nh, isNew, err = hold{Holder: h, ShareID: g.ShareID, asked: g.Amounts}, !slices.ContainsFunc(next[g.Device], func(cur hold) bool {
				return cur.Holder == h && cur.ShareID == g.ShareID
			}), nil
		}
		if err != nil {
			return nil, err
		}
		// A new Allocate starts a new wait for the kubelet to record it.
		nh.acquired, nh.recorded = now, false
		hs := slices.Clone(next[g.Device])
		if isNew {
			added = append(added, g)
			hs = append(hs, nh)
		} else {
			for i := range hs {
				if hs[i].Holder == nh.Holder && hs[i].ShareID == nh.ShareID {
					hs[i] = nh
				}
			}
		}
		next[g.Device] = hs
	}
	inv.holds = next
	if len(added) > 0 {
		inv.wakeLocked()
	}
	return added, nil
}

// Release frees everything h holds.
func (inv *Inventory) Release(h Holder) {
	inv.releaseWhere(func(_ string, cur hold) bool { return cur.Holder == h })
}

// releaseGrants frees the grants in gs that h holds.
func (inv *Inventory) releaseGrants(gs []Grant, h Holder) {
	inv.releaseWhere(func(id string, cur hold) bool {
		return cur.Holder == h && slices.ContainsFunc(gs, func(g Grant) bool { return g.Device == id && g.ShareID == cur.ShareID })
	})
}

func (inv *Inventory) releaseWhere(drop func(id string, cur hold) bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	changed := false
	for id, hs := range inv.holds {
		kept := slices.DeleteFunc(slices.Clone(hs), func(cur hold) bool { return drop(id, cur) })
		if len(kept) == len(hs) {
			continue
		}
		changed = true
		if len(kept) == 0 {
			delete(inv.holds, id)
		} else {
			inv.holds[id] = kept
		}
	}
	if changed {
		inv.wakeLocked()
	}
}

// HeldBy returns a holder of a device (the first, by name, of a shared
// device's), and false when it is free.
func (inv *Inventory) HeldBy(id string) (Holder, bool) {
	hs := inv.Holders(id)
	if len(hs) == 0 {
		return Holder{}, false
	}
	return hs[0], true
}

// Holders returns every holder of a device, sorted by name.
func (inv *Inventory) Holders(id string) []Holder {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	return holders(inv.holds[id], nil)
}

// Held returns the IDs of the devices held through front, sorted.
func (inv *Inventory) Held(front Front) []string {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	var out []string
	for id, hs := range inv.holds {
		if slices.ContainsFunc(hs, func(cur hold) bool { return cur.Front == front }) {
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
		hs := inv.holds[id]
		i := slices.IndexFunc(hs, func(cur hold) bool { return cur.Holder == dp })
		if i >= 0 {
			hs[i].recorded = true
			continue
		}
		nh, _, err := inv.ledger.admit(inv.holds, Grant{Device: id}, dp)
		if err != nil {
			// The kubelet says a container has it: it is held, whatever
			// else holds it. Two users of one device is a conflict only
			// a person can settle.
			inv.log.Error("The kubelet lists a device for a device plugin container beside other holders it does not fit with; both keep it",
				"device", id, "err", err)
			amounts, _ := inv.ledger.amounts(Grant{Device: id})
			nh = hold{Holder: dp, amounts: amounts}
		}
		nh.acquired, nh.recorded = now, true
		inv.holds[id] = append(slices.Clone(hs), nh)
		changed = true
	}
	for id, hs := range inv.holds {
		if listed[id] {
			continue
		}
		kept := slices.DeleteFunc(slices.Clone(hs), func(cur hold) bool {
			return cur.Holder == dp && (cur.recorded || now.Sub(cur.acquired) >= inv.opts.grace)
		})
		if len(kept) == len(hs) {
			continue
		}
		changed = true
		inv.log.Debug("Device plugin hold released", "device", id)
		if len(kept) == 0 {
			delete(inv.holds, id)
		} else {
			inv.holds[id] = kept
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
