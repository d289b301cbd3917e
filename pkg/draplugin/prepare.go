package draplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// CDIKind returns the CDI kind of the driver's claim specs.
func CDIKind(driver string) string { return driver + "/claim" }

// CDISpecFile returns the name of a claim's CDI spec file in CDIDir.
func CDISpecFile(driver, claimUID string) string {
	return "dpkit-dra-" + driver + "-" + claimUID + ".json"
}

// CDIDeviceName returns the CDI device of one request of a claim; a
// subrequest's '/' becomes '.' (request names are DNS labels, so it
// cannot collide).
func CDIDeviceName(claimUID, request string) string {
	return claimUID + "-" + strings.ReplaceAll(request, "/", ".")
}

// baseRequest is the request a result answers, without the subrequest a
// prioritized list (firstAvailable) chose: "gpu/big" is request "gpu". The
// kubelet matches a container's resources.claims[].request against these
// names, so a device reported under "gpu/big" would reach no container
// that names "gpu" (the kubeletplugin helper strips them the same way).
func baseRequest(name string) string {
	base, _, _ := strings.Cut(name, "/")
	return base
}

// PrepareResourceClaims prepares the claims the helper read for a
// NodePrepareResources call (allocated, of the UIDs the kubelet named).
// A claim prepared before gets the same answer without a second Allocate,
// with its holds and CDI spec file put back in place (the file may be gone:
// kubernetes#141433). What is prepared is checkpointed before it is
// reported; a checkpoint that cannot be written fails the claims of this
// call.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	if err := d.waitDevicesKnown(ctx, claims); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.syncLocked(); err != nil {
		return nil, err
	}
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	refreshed := false
	var added []string
	for _, claim := range claims {
		uid := string(claim.UID)
		if err := checkUID(uid); err != nil {
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		log := d.log.With("claim", claim.Namespace+"/"+claim.Name, "uid", uid)
		if p, ok := d.prepared[uid]; ok {
			if err := d.ensure(p); err != nil {
				log.Error("Prepare of a prepared claim failed", "err", err)
				out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
				continue
			}
			out[claim.UID] = p.result()
			continue
		}
		if d.cfg.Retired {
			err := fmt.Errorf("DRA driver %s no longer serves %s through DRA (the plugin's config has the dra front no more): it keeps only the claims prepared before; serve the resource through DRA again (fronts: [deviceplugin, dra] or [dra]) to prepare new ones", d.cfg.DriverName, d.inv.Resource())
			log.Error("Prepare refused", "err", err)
			d.metrics.operations.WithLabelValues("prepare", "error").Inc()
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		if !refreshed {
			// Devices the kubelet gave device plugin containers that have
			// ended are free again before claims are judged.
			if err := d.inv.Refresh(ctx); err != nil {
				// Refresh says when the PodResources API stops answering.
				log.Debug("Could not refresh device plugin holds; judging with the holds as they are", "err", err)
			}
			refreshed = true
		}
		p, err := d.prepareClaim(ctx, claim)
		if err != nil {
			log.Error("Prepare failed", "err", err)
			d.metrics.operations.WithLabelValues("prepare", "error").Inc()
			out[claim.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		d.metrics.operations.WithLabelValues("prepare", "success").Inc()
		log.Info("Claim prepared", "devices", len(p.DeviceIDs))
		d.prepared[uid] = p
		delete(d.unprepared, uid)
		added = append(added, uid)
		out[claim.UID] = p.result()
	}
	if len(added) > 0 {
		if err := d.saveLocked(); err != nil {
			// What this call prepared may not be reported: after a
			// restart the driver would not know it.
			for _, uid := range added {
				d.undo(d.prepared[uid])
				delete(d.prepared, uid)
				out[types.UID(uid)] = kubeletplugin.PrepareResult{Err: err}
			}
		}
	}
	d.metrics.prepared.Set(float64(len(d.prepared)))
	return out, nil
}

// FirstReportWait is how long a Prepare that comes before the plugin's
// first device report waits for it.
const FirstReportWait = 10 * time.Second

// waitDevicesKnown waits, within the kubelet's call, for the plugin's
// first device report when a claim is new to the driver. The helper
// registers the driver as it starts, which may come before the plugin
// reports (a slow discovery, a rolling update's new instance on a busy
// node): a claim judged against no devices would fail, and the kubelet
// tries a pod whose prepare failed only at its next sync, a minute later.
// Claims prepared before answer from the checkpoint without waiting. The
// wait is at most FirstReportWait: the call holds the lock that orders
// the other instance's calls in a rolling update.
func (d *Driver) waitDevicesKnown(ctx context.Context, claims []*resourcev1.ResourceClaim) error {
	ch, stop := d.inv.Watch()
	defer stop()
	if _, known := d.inv.Devices(); known || d.allPrepared(claims) {
		return nil
	}
	d.log.Info("Waiting for the plugin's first device report before preparing claims", "claims", len(claims), "atMost", FirstReportWait)
	ctx, cancel := context.WithTimeout(ctx, FirstReportWait)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("DRA driver %s: the plugin has not reported its devices of %s yet, so no claim can be prepared: %w (its discovery is slow or failing: see the plugin's log; the kubelet retries)", d.cfg.DriverName, d.inv.Resource(), ctx.Err())
		case <-ch:
		}
		if _, known := d.inv.Devices(); known {
			return nil
		}
	}
}

// allPrepared says whether the checkpoint lists every claim.
func (d *Driver) allPrepared(claims []*resourcev1.ResourceClaim) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.syncLocked(); err != nil {
		return false // PrepareResourceClaims says why
	}
	for _, c := range claims {
		if _, ok := d.prepared[string(c.UID)]; !ok {
			return false
		}
	}
	return true
}

func (d *Driver) saveLocked() error { return writeCheckpoint(d.checkpointPath, d.prepared) }

// syncLocked reads the checkpoint again: in a rolling update the other
// instance may have prepared or unprepared claims since (the helper's
// file lock orders the calls of both). Claims it prepared are held here
// too; claims it unprepared are released.
func (d *Driver) syncLocked() error {
	if d.cfg.PodUID == "" {
		return nil // one instance: the checkpoint is what d.prepared says
	}
	onDisk, err := readCheckpoint(d.checkpointPath)
	if err != nil {
		return err
	}
	for uid, p := range d.prepared {
		if _, ok := onDisk[uid]; !ok {
			d.inv.Release(inventory.ClaimHolder(p.Namespace, p.Name, p.UID))
		}
	}
	for uid, p := range onDisk {
		if _, ok := d.prepared[uid]; !ok {
			if err := d.inv.AcquireGrants(p.grants(), inventory.ClaimHolder(p.Namespace, p.Name, p.UID)); err != nil {
				d.log.Error("A claim the other instance prepared holds devices this one gave out", "uid", uid, "err", err)
			}
		}
	}
	d.prepared = onDisk
	return nil
}

// picked is one device of a claim's allocation, by request.
type picked struct {
	name, id, shareID string
	consumed          map[resourcev1.QualifiedName]resource.Quantity
}

// claimGrants reads what claim's allocation takes of this driver's
// devices: the grants it holds in the arbiter (an admin-access result
// observes its device without holding it: another claim or a device
// plugin container may hold it, and may take it after), and the devices
// of each request. It fails for a device not of this node's pool or
// devices, and for a claim that allocates none of the driver's.
func (d *Driver) claimGrants(claim *resourcev1.ResourceClaim) ([]inventory.Grant, map[string][]picked, error) {
	devs, _ := d.inv.Devices()
	names := nameDevices(devs, d.log)
	byRequest := map[string][]picked{}
	var grants []inventory.Grant
	observed := 0
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		if r.Pool != d.cfg.PoolName {
			return nil, nil, fmt.Errorf("ResourceClaim %s/%s: device %s is of pool %q, this node's pool is %q", claim.Namespace, claim.Name, r.Device, r.Pool, d.cfg.PoolName)
		}
		id, ok := names.byName[r.Device]
		if !ok {
			return nil, nil, fmt.Errorf("ResourceClaim %s/%s: device %s is not among this node's devices of %s (was it removed?)", claim.Namespace, claim.Name, r.Device, d.inv.Resource())
		}
		pk := picked{name: r.Device, id: id, consumed: r.ConsumedCapacity}
		if r.ShareID != nil {
			pk.shareID = string(*r.ShareID)
		}
		req := baseRequest(r.Request)
		byRequest[req] = append(byRequest[req], pk)
		if r.AdminAccess != nil && *r.AdminAccess {
			observed++
			continue
		}
		g := inventory.Grant{Device: id, ShareID: pk.shareID, Amounts: d.amounts(id, r.ConsumedCapacity)}
		if !slices.ContainsFunc(grants, func(o inventory.Grant) bool { return o.Device == g.Device && o.ShareID == g.ShareID }) {
			grants = append(grants, g)
		}
	}
	if len(grants) == 0 && observed == 0 {
		return nil, nil, fmt.Errorf("ResourceClaim %s/%s allocates no device of driver %s", claim.Namespace, claim.Name, d.cfg.DriverName)
	}
	return grants, byRequest, nil
}

// prepareClaim prepares one claim that was not prepared before.
func (d *Driver) prepareClaim(ctx context.Context, claim *resourcev1.ResourceClaim) (*preparedClaim, error) {
	uid := string(claim.UID)
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	grants, byRequest, err := d.claimGrants(claim)
	if err != nil {
		return nil, err
	}
	holder := inventory.ClaimHolder(claim.Namespace, claim.Name, uid)
	if err := d.inv.AcquireGrants(grants, holder); err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s cannot be prepared: %w", claim.Namespace, claim.Name, err)
	}
	p := &preparedClaim{
		Namespace: claim.Namespace, Name: claim.Name, UID: uid, Grants: grants,
		Spec: &cdispec.Spec{Kind: CDIKind(d.cfg.DriverName)},
	}
	for _, g := range grants {
		if !slices.Contains(p.DeviceIDs, g.Device) {
			p.DeviceIDs = append(p.DeviceIDs, g.Device)
		}
	}
	requests := sortedKeys(byRequest)
	for _, req := range requests {
		var devIDs []string
		for _, pk := range byRequest[req] {
			if !slices.Contains(devIDs, pk.id) {
				devIDs = append(devIDs, pk.id)
			}
		}
		resp, err := d.inv.Plugin().Allocate(ctx, devIDs)
		if err != nil {
			d.inv.Release(holder)
			return nil, fmt.Errorf("ResourceClaim %s/%s, request %s: the plugin's Allocate of %v failed: %w", claim.Namespace, claim.Name, req, devIDs, err)
		}
		cdiName := CDIDeviceName(uid, req)
		p.Spec.Devices = append(p.Spec.Devices, cdispec.Device{Name: cdiName, ContainerEdits: d.containerEdits(resp)})
		cdiIDs := []string{CDIKind(d.cfg.DriverName) + "=" + cdiName}
		for _, cd := range resp.GetCdiDevices() {
			cdiIDs = append(cdiIDs, cd.GetName())
		}
		for _, pk := range byRequest[req] {
			ids := cdiIDs
			if pk.shareID != "" {
				// Each share gets a CDI device of its own that tells
				// the container its share: what a driver hands the
				// runtime to enforce it (an MPS limit, a cgroup).
				share := CDIDeviceName(uid, req) + "-" + pk.shareID
				p.Spec.Devices = append(p.Spec.Devices, cdispec.Device{Name: share, ContainerEdits: d.shareEdits(pk.name, pk.shareID, pk.consumed)})
				ids = append([]string{CDIKind(d.cfg.DriverName) + "=" + share}, cdiIDs...)
			}
			p.Devices = append(p.Devices, preparedDevice{Requests: []string{req}, Pool: d.cfg.PoolName, Device: pk.name, CDIDeviceIDs: ids, ShareID: pk.shareID})
		}
	}
	version, err := cdispec.MinimumRequiredVersion(p.Spec)
	if err != nil {
		d.inv.Release(holder)
		return nil, fmt.Errorf("CDI spec of ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	p.Spec.Version = version
	if err := d.writeSpec(p); err != nil {
		d.inv.Release(holder)
		return nil, err
	}
	return p, nil
}

// Environment variables of a share's CDI device.
const (
	// EnvShareID is the share's ID (the allocation's shareID).
	EnvShareID = "DPKIT_SHARE_ID"
	// EnvShareDevice is the DRA device the share is of.
	EnvShareDevice = "DPKIT_SHARE_DEVICE"
	// EnvSharePrefix starts one variable per capacity the share took,
	// such as DPKIT_SHARE_MEMORY=20Gi.
	EnvSharePrefix = "DPKIT_SHARE_"
)

// shareEdits are the container edits of one share: its ID, its device,
// and what it took of each capacity.
func (d *Driver) shareEdits(device, shareID string, consumed map[resourcev1.QualifiedName]resource.Quantity) cdispec.ContainerEdits {
	e := cdispec.ContainerEdits{Env: []string{EnvShareID + "=" + shareID, EnvShareDevice + "=" + device}}
	names := make([]string, 0, len(consumed))
	for k := range consumed {
		names = append(names, string(k))
	}
	sort.Strings(names)
	for _, k := range names {
		q := consumed[resourcev1.QualifiedName(k)]
		short := strings.TrimPrefix(k, d.cfg.DriverName+"/")
		e.Env = append(e.Env, EnvSharePrefix+envName(short)+"="+q.String())
	}
	return e
}

// envName makes an environment variable's name part of a capacity name:
// upper case, every other character '_'.
func envName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, s)
}

// amounts turns an allocation's consumed capacity of device id into the
// arbiter's amounts: its shared capacities, named without the driver's
// domain, in base units.
func (d *Driver) amounts(id string, consumed map[resourcev1.QualifiedName]resource.Quantity) map[string]int64 {
	if len(consumed) == 0 {
		return nil
	}
	var shared map[string]deviceplugin.SharedCapacity
	if describer, ok := d.inv.Plugin().(deviceplugin.Describer); ok {
		if info, ok := describer.Describe(id); ok && info.Sharing != nil {
			shared = info.Sharing.Shared
		}
	}
	out := make(map[string]int64, len(consumed))
	for k, q := range consumed {
		name := strings.TrimPrefix(string(k), d.cfg.DriverName+"/")
		if _, ok := shared[name]; ok {
			out[name] = q.Value()
		}
	}
	return out
}

// containerEdits turns a device plugin answer into CDI container edits.
// Annotations have no CDI form and are left out.
func (d *Driver) containerEdits(resp *pluginapi.ContainerAllocateResponse) cdispec.ContainerEdits {
	var e cdispec.ContainerEdits
	for _, k := range sortedKeys(resp.GetEnvs()) {
		e.Env = append(e.Env, k+"="+resp.GetEnvs()[k])
	}
	for _, m := range resp.GetMounts() {
		opts := []string{"rbind", "rw"}
		if m.GetReadOnly() {
			opts = []string{"rbind", "ro"}
		}
		e.Mounts = append(e.Mounts, &cdispec.Mount{HostPath: m.GetHostPath(), ContainerPath: m.GetContainerPath(), Options: opts})
	}
	for _, dev := range resp.GetDevices() {
		e.DeviceNodes = append(e.DeviceNodes, &cdispec.DeviceNode{Path: dev.GetContainerPath(), HostPath: dev.GetHostPath(), Permissions: dev.GetPermissions()})
	}
	if len(resp.GetAnnotations()) > 0 {
		d.log.Debug("Allocate returned annotations; CDI has no place for them, left out", "annotations", len(resp.GetAnnotations()))
	}
	return e
}

// uidChars are the characters a claim UID may hold.
const uidChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._"

// checkUID refuses a claim UID that is not a UID (letters, digits, '-',
// '.' and '_', at most 128): the CDI spec's file name is made from it, and
// "x/../../y" would name another file (Unprepare removes it).
func checkUID(uid string) error {
	ok := uid != "" && len(uid) <= 128 && uid != "." && uid != ".."
	for _, r := range uid {
		if !strings.ContainsRune(uidChars, r) {
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("claim UID %q is not a UID (want letters, digits, '-', '.' or '_', as a ResourceClaim's metadata.uid)", uid)
	}
	return nil
}

func (d *Driver) specPath(uid string) string {
	return filepath.Join(d.cfg.CDIDir, CDISpecFile(d.cfg.DriverName, uid))
}

func (d *Driver) writeSpec(p *preparedClaim) error {
	blob, err := json.MarshalIndent(p.Spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.cfg.CDIDir, 0o755); err != nil { //nolint:gosec // the container runtime reads CDI specs
		return fmt.Errorf("CDI directory: %w", err)
	}
	if err := fileutil.WriteAtomic(d.specPath(p.UID), blob, 0o644); err != nil { //nolint:gosec // the container runtime reads CDI specs
		return fmt.Errorf("write the CDI spec of ResourceClaim %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// ensure puts a prepared claim's holds and CDI spec file back in place.
func (d *Driver) ensure(p *preparedClaim) error {
	if err := d.inv.AcquireGrants(p.grants(), inventory.ClaimHolder(p.Namespace, p.Name, p.UID)); err != nil {
		return fmt.Errorf("ResourceClaim %s/%s was prepared, but its devices are taken: %w", p.Namespace, p.Name, err)
	}
	if _, err := os.Stat(d.specPath(p.UID)); errors.Is(err, os.ErrNotExist) {
		d.log.Warn("The CDI spec of a prepared claim is gone; writing it again", "claim", p.Namespace+"/"+p.Name, "file", d.specPath(p.UID))
		d.metrics.specsRewritten.Inc()
		return d.writeSpec(p)
	}
	return nil
}

// undo releases a claim's holds and removes its spec file.
func (d *Driver) undo(p *preparedClaim) {
	d.inv.Release(inventory.ClaimHolder(p.Namespace, p.Name, p.UID))
	if err := os.Remove(d.specPath(p.UID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		d.log.Warn("Could not remove a CDI spec", "file", d.specPath(p.UID), "err", err)
	}
}

// restore re-acquires the holds of every checkpointed claim and writes
// CDI specs that are gone.
func (d *Driver) restore() {
	d.mu.Lock()
	defer d.mu.Unlock()
	uids := make([]string, 0, len(d.prepared))
	for uid := range d.prepared {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	for _, uid := range uids {
		if err := d.ensure(d.prepared[uid]); err != nil {
			d.log.Error("Could not restore a prepared claim", "uid", uid, "err", err)
		}
	}
	d.metrics.prepared.Set(float64(len(d.prepared)))
}

// UnprepareResourceClaims undoes what PrepareResourceClaims did: the
// claims' devices are released and their CDI spec files removed once the
// checkpoint no longer lists them. A claim not prepared (never, or
// unprepared before) succeeds, and no spec file of it is left.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.syncLocked(); err != nil {
		return nil, err
	}
	out := make(map[types.UID]error, len(claims))
	var gone []*preparedClaim
	for _, c := range claims {
		uid := string(c.UID)
		if err := checkUID(uid); err != nil {
			out[c.UID] = err
			continue
		}
		out[c.UID] = nil
		if d.cfg.Allocated != nil {
			d.unprepared[uid] = true
		}
		p, ok := d.prepared[uid]
		if !ok {
			d.undo(&preparedClaim{Namespace: c.Namespace, Name: c.Name, UID: uid})
			continue
		}
		delete(d.prepared, uid)
		gone = append(gone, p)
	}
	if len(gone) > 0 {
		if err := d.saveLocked(); err != nil {
			for _, p := range gone {
				d.prepared[p.UID] = p
				out[types.UID(p.UID)] = err
			}
			return out, nil
		}
		for _, p := range gone {
			d.undo(p)
			d.metrics.operations.WithLabelValues("unprepare", "success").Inc()
			d.log.Info("Claim unprepared", "claim", p.Namespace+"/"+p.Name, "uid", p.UID)
		}
	}
	d.metrics.prepared.Set(float64(len(d.prepared)))
	return out, nil
}
