package dra

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

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/internal/fileutil"
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

// nodeService serves DRAPlugin.
type nodeService struct {
	drav1.UnimplementedDRAPluginServer
	d *Driver
}

func (s nodeService) NodePrepareResources(ctx context.Context, req *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	return s.d.prepare(ctx, req.GetClaims()), nil
}

func (s nodeService) NodeUnprepareResources(_ context.Context, req *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	return s.d.unprepare(req.GetClaims()), nil
}

func (d *Driver) prepare(ctx context.Context, claims []*drav1.Claim) *drav1.NodePrepareResourcesResponse {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := &drav1.NodePrepareResourcesResponse{Claims: make(map[string]*drav1.NodePrepareResourceResponse, len(claims))}
	refreshed := false
	var added []string
	for _, c := range claims {
		if err := checkUID(c.GetUid()); err != nil {
			out.Claims[c.GetUid()] = &drav1.NodePrepareResourceResponse{Error: err.Error()}
			continue
		}
		log := d.log.With("claim", c.GetNamespace()+"/"+c.GetName(), "uid", c.GetUid())
		if p, ok := d.prepared[c.GetUid()]; ok {
			// Prepared before: the same answer, with its spec file and holds
			// in place (the file may be gone: kubernetes#141433).
			if err := d.ensure(p); err != nil {
				log.Error("Prepare of a prepared claim failed", "err", err)
				out.Claims[c.GetUid()] = &drav1.NodePrepareResourceResponse{Error: err.Error()}
				continue
			}
			out.Claims[c.GetUid()] = p.response()
			continue
		}
		if !refreshed {
			// Devices the kubelet gave device plugin containers that have
			// ended are free again before claims are judged.
			if err := d.inv.Refresh(ctx); err != nil {
				log.Warn("Could not refresh device plugin holds; judging with the holds as they are", "err", err)
			}
			refreshed = true
		}
		p, err := d.prepareClaim(ctx, c)
		if err != nil {
			log.Error("Prepare failed", "err", err)
			d.metrics.operations.WithLabelValues("prepare", "error").Inc()
			out.Claims[c.GetUid()] = &drav1.NodePrepareResourceResponse{Error: err.Error()}
			continue
		}
		d.metrics.operations.WithLabelValues("prepare", "success").Inc()
		log.Info("Claim prepared", "devices", len(p.DeviceIDs))
		d.prepared[c.GetUid()] = p
		added = append(added, c.GetUid())
		out.Claims[c.GetUid()] = p.response()
	}
	if len(added) > 0 {
		if err := d.saveLocked(); err != nil {
			// What this call prepared may not be reported: after a
			// restart the driver would not know it.
			for _, uid := range added {
				d.undo(d.prepared[uid])
				delete(d.prepared, uid)
				out.Claims[uid] = &drav1.NodePrepareResourceResponse{Error: err.Error()}
			}
		}
	}
	d.metrics.prepared.Set(float64(len(d.prepared)))
	return out
}

func (d *Driver) saveLocked() error { return writeCheckpoint(d.checkpointPath, d.prepared) }

// prepareClaim prepares one claim that was not prepared before.
func (d *Driver) prepareClaim(ctx context.Context, c *drav1.Claim) (*preparedClaim, error) {
	claim, err := d.cfg.Claims.GetResourceClaim(ctx, c.GetNamespace(), c.GetName())
	if err != nil {
		return nil, fmt.Errorf("fetch ResourceClaim %s/%s: %w", c.GetNamespace(), c.GetName(), err)
	}
	if string(claim.UID) != c.GetUid() {
		return nil, fmt.Errorf("ResourceClaim %s/%s has UID %s, the kubelet asked for %s: the claim was deleted and created again", c.GetNamespace(), c.GetName(), claim.UID, c.GetUid())
	}
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s is not allocated", c.GetNamespace(), c.GetName())
	}
	devs, _ := d.inv.Devices()
	names := nameDevices(devs, d.log)
	type picked struct{ name, id string }
	byRequest := map[string][]picked{}
	// ids are the devices the claim holds in the arbiter; an admin-access
	// result observes its device without holding it (another claim or a
	// device plugin container may hold it, and may take it after).
	var ids []string
	observed := 0
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		if r.Pool != d.cfg.PoolName {
			return nil, fmt.Errorf("ResourceClaim %s/%s: device %s is of pool %q, this node's pool is %q", c.GetNamespace(), c.GetName(), r.Device, r.Pool, d.cfg.PoolName)
		}
		id, ok := names.byName[r.Device]
		if !ok {
			return nil, fmt.Errorf("ResourceClaim %s/%s: device %s is not among this node's devices of %s (was it removed?)", c.GetNamespace(), c.GetName(), r.Device, d.inv.Resource())
		}
		req := baseRequest(r.Request)
		byRequest[req] = append(byRequest[req], picked{r.Device, id})
		if r.AdminAccess != nil && *r.AdminAccess {
			observed++
			continue
		}
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 && observed == 0 {
		return nil, fmt.Errorf("ResourceClaim %s/%s allocates no device of driver %s", c.GetNamespace(), c.GetName(), d.cfg.DriverName)
	}
	holder := inventory.ClaimHolder(c.GetNamespace(), c.GetName(), c.GetUid())
	if err := d.inv.Acquire(ids, holder); err != nil {
		return nil, fmt.Errorf("ResourceClaim %s/%s cannot be prepared: %w", c.GetNamespace(), c.GetName(), err)
	}
	p := &preparedClaim{
		Namespace: c.GetNamespace(), Name: c.GetName(), UID: c.GetUid(), DeviceIDs: ids,
		Spec: &cdispec.Spec{Kind: CDIKind(d.cfg.DriverName)},
	}
	requests := sortedKeys(byRequest)
	for _, req := range requests {
		devIDs := make([]string, len(byRequest[req]))
		for i, pk := range byRequest[req] {
			devIDs[i] = pk.id
		}
		resp, err := d.inv.Plugin().Allocate(ctx, devIDs)
		if err != nil {
			d.inv.Release(holder)
			return nil, fmt.Errorf("ResourceClaim %s/%s, request %s: the plugin's Allocate of %v failed: %w", c.GetNamespace(), c.GetName(), req, devIDs, err)
		}
		cdiName := CDIDeviceName(c.GetUid(), req)
		p.Spec.Devices = append(p.Spec.Devices, cdispec.Device{Name: cdiName, ContainerEdits: d.containerEdits(resp)})
		cdiIDs := []string{CDIKind(d.cfg.DriverName) + "=" + cdiName}
		for _, cd := range resp.GetCdiDevices() {
			cdiIDs = append(cdiIDs, cd.GetName())
		}
		for _, pk := range byRequest[req] {
			p.Devices = append(p.Devices, preparedDevice{Requests: []string{req}, Pool: d.cfg.PoolName, Device: pk.name, CDIDeviceIDs: cdiIDs})
		}
	}
	version, err := cdispec.MinimumRequiredVersion(p.Spec)
	if err != nil {
		d.inv.Release(holder)
		return nil, fmt.Errorf("CDI spec of ResourceClaim %s/%s: %w", c.GetNamespace(), c.GetName(), err)
	}
	p.Spec.Version = version
	if err := d.writeSpec(p); err != nil {
		d.inv.Release(holder)
		return nil, err
	}
	return p, nil
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
	if err := d.inv.Acquire(p.DeviceIDs, inventory.ClaimHolder(p.Namespace, p.Name, p.UID)); err != nil {
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

func (d *Driver) unprepare(claims []*drav1.Claim) *drav1.NodeUnprepareResourcesResponse {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := &drav1.NodeUnprepareResourcesResponse{Claims: make(map[string]*drav1.NodeUnprepareResourceResponse, len(claims))}
	var gone []*preparedClaim
	for _, c := range claims {
		if err := checkUID(c.GetUid()); err != nil {
			out.Claims[c.GetUid()] = &drav1.NodeUnprepareResourceResponse{Error: err.Error()}
			continue
		}
		out.Claims[c.GetUid()] = &drav1.NodeUnprepareResourceResponse{}
		p, ok := d.prepared[c.GetUid()]
		if !ok {
			// Unknown: never prepared, or unprepared already. Leave no
			// spec file behind either way.
			d.undo(&preparedClaim{Namespace: c.GetNamespace(), Name: c.GetName(), UID: c.GetUid()})
			continue
		}
		delete(d.prepared, c.GetUid())
		gone = append(gone, p)
	}
	if len(gone) > 0 {
		if err := d.saveLocked(); err != nil {
			for _, p := range gone {
				d.prepared[p.UID] = p
				out.Claims[p.UID] = &drav1.NodeUnprepareResourceResponse{Error: err.Error()}
			}
			return out
		}
		for _, p := range gone {
			d.undo(p)
			d.metrics.operations.WithLabelValues("unprepare", "success").Inc()
			d.log.Info("Claim unprepared", "claim", p.Namespace+"/"+p.Name, "uid", p.UID)
		}
	}
	d.metrics.prepared.Set(float64(len(d.prepared)))
	return out
}
