package draplugin

import (
	"context"
	"maps"
	"time"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/dpkit/dpkit/pkg/inventory"
)

// reserveAllocated holds in the inventory the devices of every claim the
// scheduler allocated from the driver's pool, from the allocation on
// rather than from Prepare, until the claim is deallocated or deleted,
// or Unprepare releases them as before (a claim unprepared is not held
// again while it stays allocated: the kubelet is done with it, and a
// driver's Unprepare frees its devices). Served through both fronts, a device a claim was
// just allocated then leaves the device plugin front's ListAndWatch at
// once, and the kubelet's device manager stops giving it to an
// extended-resource pod in the window between the scheduler's allocation
// and the kubelet's Prepare. A device the device plugin front took first
// stays its own, and the claim's Prepare fails naming it, as before; the
// claim is held as soon as the device is free. It runs until ctx ends,
// and then releases what it held for claims not prepared.
func (d *Driver) reserveAllocated(ctx context.Context) {
	wake := make(chan struct{}, 1)
	kick := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	unsubscribe := d.cfg.Allocated.subscribe(d.cfg.DriverName, d.cfg.PoolName, kick)
	defer unsubscribe()
	changed, stop := d.inv.Watch()
	defer stop()
	reserved := map[string]inventory.Holder{} // claim UID -> its holder
	defer func() { d.releaseReserved(reserved, nil) }()
	if !d.cfg.Allocated.waitSynced(ctx) {
		return
	}
	for {
		if claims, ok := d.cfg.Allocated.allocated(d.cfg.DriverName, d.cfg.PoolName); ok {
			d.reserve(reserved, claims)
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-changed:
		}
	}
}

// reserve holds the devices of claims, all allocated from the driver's
// pool and not unprepared here, and releases those of reserved claims no
// longer among them.
func (d *Driver) reserve(reserved map[string]inventory.Holder, claims []*resourcev1.ResourceClaim) {
	now, keep := map[string]bool{}, map[string]bool{}
	d.mu.Lock()
	done := maps.Clone(d.unprepared)
	d.mu.Unlock()
	for _, c := range claims {
		uid := string(c.UID)
		now[uid] = true
		if done[uid] {
			continue // unprepared here: released below if held since
		}
		keep[uid] = true
		grants, _, err := d.claimGrants(c)
		if err != nil {
			continue // not scanned yet, or not this node's: Prepare says why
		}
		h := inventory.ClaimHolder(c.Namespace, c.Name, uid)
		if err := d.inv.AcquireGrants(grants, h); err != nil {
			// Taken first through the other front, or by another
			// claim: tried again when the inventory changes.
			delete(reserved, uid)
			continue
		}
		if _, was := reserved[uid]; !was {
			d.log.Debug("Holding the devices of an allocated claim before its Prepare", "claim", c.Namespace+"/"+c.Name, "uid", uid)
		}
		reserved[uid] = h
	}
	d.releaseReserved(reserved, keep)
	d.mu.Lock()
	for uid := range d.unprepared {
		if !now[uid] {
			delete(d.unprepared, uid) // no longer allocated
		}
	}
	d.mu.Unlock()
}

// releaseReserved releases the reserved claims not in keep that the
// driver has not prepared (a prepared claim is released by Unprepare).
func (d *Driver) releaseReserved(reserved map[string]inventory.Holder, keep map[string]bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, h := range reserved {
		if keep[uid] {
			continue
		}
		delete(reserved, uid)
		if _, prepared := d.prepared[uid]; !prepared {
			d.inv.Release(h)
		}
	}
}

// syncPoll is how often waitSynced looks whether the informer has listed
// the claims.
const syncPoll = 100 * time.Millisecond

// waitSynced waits until the informer has listed every claim once, and
// says whether it did: false when ctx ended or listing is refused.
func (a *AllocatedClaims) waitSynced(ctx context.Context) bool {
	t := time.NewTicker(syncPoll)
	defer t.Stop()
	for {
		a.mu.Lock()
		inf, refused := a.informer, a.refused
		a.mu.Unlock()
		switch {
		case refused:
			return false
		case inf != nil && inf.HasSynced():
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}
