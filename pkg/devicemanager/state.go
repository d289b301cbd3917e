package devicemanager

import (
	"errors"
	"sort"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
	"github.com/dpkit/dpkit/pkg/topology"
)

var timeZero time.Time

// nodeWithoutTopology is the checkpoint's NUMA key for devices without NUMA
// information.
const nodeWithoutTopology = -1

func (r *resourceState) addFree(d *device) {
	p := r.free[d.mask]
	if p == nil {
		p = &pool{}
		r.free[d.mask] = p
	}
	p.add(d)
}

func (r *resourceState) removeFree(d *device) {
	if d.poolIdx < 0 {
		return
	}
	p := r.free[d.mask]
	p.remove(d)
	if len(p.devs) == 0 {
		delete(r.free, d.mask)
	}
}

func (r *resourceState) freeCount() int {
	n := 0
	for _, p := range r.free {
		n += len(p.devs)
	}
	return n
}

// applyDevices replaces the resource's device set with a ListAndWatch
// message from e. Updates from an endpoint that is not the resource's
// primary one are ignored. Cost is linear in the number of devices.
func (m *Manager) applyDevices(e *endpoint, devs []*pluginapi.Device) {
	m.mu.Lock()
	r := m.resources[e.resource]
	if r == nil || r.primary != e || m.stopping {
		m.mu.Unlock()
		m.log.Debug("Ignoring ListAndWatch update from a non-primary plugin instance", "resource", e.resource, "endpoint", e.socket)
		return
	}
	owned := m.owner[r.name]
	r.gen++
	r.listed = true
	gen := r.gen
	groups := make(topology.DeviceGroups, len(r.groups))
	healthy, kept := 0, 0
	for _, pd := range devs {
		if pd == nil {
			continue
		}
		isHealthy := pd.Health == pluginapi.Healthy
		nodes := pd.GetTopology().GetNodes()
		var mask topology.Mask
		for _, n := range nodes {
			if n != nil && n.ID >= 0 && n.ID < topology.MaxNUMANodes {
				mask |= 1 << uint(n.ID)
			}
		}
		d := r.devices[pd.ID]
		if d == nil {
			d = &device{id: pd.ID, poolIdx: -1, gen: gen - 1}
			r.devices[pd.ID] = d
		} else if d.gen == gen {
			m.log.Warn("Device reported twice in one ListAndWatch message; keeping the first", "resource", r.name, "device", pd.ID)
			continue
		}
		if d.mask != mask {
			r.removeFree(d)
		}
		if !sameNUMA(d.numa, nodes) {
			d.numa = d.numa[:0:0]
			for _, n := range nodes {
				if n != nil {
					d.numa = append(d.numa, n.ID)
				}
			}
		}
		d.healthy, d.mask, d.gen = isHealthy, mask, gen
		_, inUse := owned[d.id]
		switch free := isHealthy && !inUse; {
		case free && d.poolIdx < 0:
			r.addFree(d)
		case !free && d.poolIdx >= 0:
			r.removeFree(d)
		}
		if isHealthy {
			healthy++
		}
		groups[mask]++
		kept++
	}
	if kept != len(r.devices) {
		for id, d := range r.devices {
			if d.gen != gen {
				r.removeFree(d)
				delete(r.devices, id)
			}
		}
	}
	r.groups, r.healthy, r.reported = groups, healthy, true
	m.mu.Unlock()
	m.log.Debug("Processed device update", "resource", r.name, "total", len(devs), "healthy", healthy)
	// Like the kubelet, every message is checkpointed before the next one
	// is read: RegisteredDevices follows the latest list, and a resource
	// whose first list is empty is recorded too. Subscribers hear of the
	// change once it is on disk.
	_ = m.writeCheckpoint()
	m.mu.Lock()
	m.notifyLocked()
	m.mu.Unlock()
}

func (m *Manager) markUnhealthyLocked(r *resourceState) {
	for _, d := range r.devices {
		d.healthy = false
		r.removeFree(d)
	}
	r.healthy, r.reported = 0, false
}

// reserveLocked marks d of r as held by podUID.
func (m *Manager) reserveLocked(r *resourceState, d *device, podUID string) {
	r.removeFree(d)
	o := m.owner[r.name]
	if o == nil {
		o = make(map[string]string)
		m.owner[r.name] = o
	}
	o[d.id] = podUID
	p := m.podLocked(podUID)
	s := p.owned[r.name]
	if s == nil {
		s = make(map[string]struct{})
		p.owned[r.name] = s
	}
	s[d.id] = struct{}{}
}

// releaseLocked frees device id of resource held by podUID.
func (m *Manager) releaseLocked(resource, id, podUID string) {
	if o := m.owner[resource]; o != nil && o[id] == podUID {
		delete(o, id)
		if len(o) == 0 {
			delete(m.owner, resource)
		}
	}
	if p := m.pods[podUID]; p != nil {
		if s := p.owned[resource]; s != nil {
			delete(s, id)
			if len(s) == 0 {
				delete(p.owned, resource)
			}
		}
	}
	if r := m.resources[resource]; r != nil {
		if d := r.devices[id]; d != nil && d.healthy && d.poolIdx < 0 {
			r.addFree(d)
		}
	}
}

func (m *Manager) podLocked(uid string) *podState {
	p := m.pods[uid]
	if p == nil {
		p = &podState{containers: make(map[string]map[string]*resAlloc), owned: make(map[string]map[string]struct{})}
		m.pods[uid] = p
	}
	return p
}

// releaseUnreferencedLocked frees the pod's devices that no container of
// the pod holds any more and forgets the pod when it holds nothing.
func (m *Manager) releaseUnreferencedLocked(uid string) {
	p := m.pods[uid]
	if p == nil {
		return
	}
	ref := make(map[string]map[string]struct{})
	for _, res := range p.containers {
		for rn, a := range res {
			s := ref[rn]
			if s == nil {
				s = make(map[string]struct{})
				ref[rn] = s
			}
			for _, id := range a.ids {
				s[id] = struct{}{}
			}
		}
	}
	for rn, ids := range p.owned {
		for id := range ids {
			if _, ok := ref[rn][id]; !ok {
				m.releaseLocked(rn, id, uid)
			}
		}
	}
	if len(p.containers) == 0 && len(p.owned) == 0 {
		delete(m.pods, uid)
	}
}

func (m *Manager) numaOf(r *resourceState, ids []string) checkpoint.DevicesPerNUMA {
	out := make(checkpoint.DevicesPerNUMA)
	for _, id := range ids {
		var d *device
		if r != nil {
			d = r.devices[id]
		}
		if d == nil || len(d.numa) == 0 {
			out[nodeWithoutTopology] = append(out[nodeWithoutTopology], id)
			continue
		}
		for _, n := range d.numa {
			out[n] = append(out[n], id)
		}
	}
	return out
}

// snapshotLocked builds the checkpoint content: the assignments, encoded
// once each, in a stable order, and each listed resource's healthy IDs
// (unsorted).
func (m *Manager) snapshotLocked() ([]*checkpoint.Entry, map[string][]string) {
	var entries []*checkpoint.Entry
	for _, uid := range sortedKeys(m.pods) {
		p := m.pods[uid]
		for _, cn := range sortedKeys(p.containers) {
			for _, rn := range sortedKeys(p.containers[cn]) {
				a := p.containers[cn][rn]
				if a.entry == nil {
					a.entry = checkpoint.NewEntry(checkpoint.PodDevicesEntry{
						PodUID: uid, ContainerName: cn, ResourceName: rn, DeviceIDs: a.numa, AllocResp: a.raw,
					})
				}
				entries = append(entries, a.entry)
			}
		}
	}
	registered := make(map[string][]string, len(m.resources))
	for name, r := range m.resources {
		if !r.listed {
			continue
		}
		ids := make([]string, 0, r.healthy)
		for id, d := range r.devices {
			if d.healthy {
				ids = append(ids, id)
			}
		}
		registered[name] = ids
	}
	return entries, registered
}

// sortRegistered puts each resource's registered IDs in order. It runs
// outside m.mu: a checkpoint is written after every ListAndWatch message,
// and sorting 100,000 IDs under the lock would hold up admission.
func sortRegistered(registered map[string][]string) {
	for _, ids := range registered {
		sort.Strings(ids)
	}
}

// writeCheckpoint writes the current state, once per call as the kubelet
// does (the side-by-side tests watch for the write after each change).
// Failures are logged and returned.
func (m *Manager) writeCheckpoint() error {
	if m.skipCheckpoint {
		return nil
	}
	m.cpMu.Lock()
	defer m.cpMu.Unlock()
	m.mu.Lock()
	entries, registered := m.snapshotLocked()
	m.mu.Unlock()
	sortRegistered(registered)
	if err := checkpoint.WriteFile(m.CheckpointPath(), checkpoint.MarshalEntries(entries, registered)); err != nil {
		m.log.Error("Failed to write checkpoint", "path", m.CheckpointPath(), "err", err)
		return err
	}
	return nil
}

// restoreCheckpoint loads assignments and registered resource names. A
// missing checkpoint is normal; a corrupt or foreign one is reported and
// ignored.
func (m *Manager) restoreCheckpoint() {
	cp, err := checkpoint.Read(m.CheckpointPath())
	if errors.Is(err, checkpoint.ErrNotFound) {
		m.log.Info("No device manager checkpoint; starting empty", "path", m.CheckpointPath())
		return
	}
	if err != nil {
		m.log.Error("Ignoring unreadable device manager checkpoint; pods admitted before it are held back (see HoldUnknown)", "path", m.CheckpointPath(), "err", err)
		m.mu.Lock()
		m.checkpointLost = true
		m.mu.Unlock()
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Clock.Now()
	restored := 0
	for _, e := range cp.Entries {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(e.AllocResp, resp); err != nil {
			m.log.Error("Skipping checkpoint entry with an unreadable Allocate response", "pod", e.PodUID, "container", e.ContainerName, "resource", e.ResourceName, "err", err)
			continue
		}
		ids := e.DeviceIDs.Devices()
		sort.Strings(ids)
		conflict := false
		for _, id := range ids {
			if o, ok := m.owner[e.ResourceName][id]; ok && o != e.PodUID {
				m.log.Error("Skipping checkpoint entry: device already held by another pod", "pod", e.PodUID, "container", e.ContainerName, "resource", e.ResourceName, "device", id, "holder", o)
				conflict = true
				break
			}
		}
		if conflict {
			continue
		}
		p := m.podLocked(e.PodUID)
		if p.containers[e.ContainerName] == nil {
			p.containers[e.ContainerName] = make(map[string]*resAlloc)
		}
		if _, dup := p.containers[e.ContainerName][e.ResourceName]; dup {
			// A hand-edited or damaged checkpoint: keeping both would
			// leave the first entry's devices held by nobody's record.
			m.log.Error("Skipping duplicate checkpoint entry", "pod", e.PodUID, "container", e.ContainerName, "resource", e.ResourceName)
			continue
		}
		p.containers[e.ContainerName][e.ResourceName] = &resAlloc{ids: ids, numa: e.DeviceIDs, resp: resp, raw: e.AllocResp}
		o := m.owner[e.ResourceName]
		if o == nil {
			o = make(map[string]string)
			m.owner[e.ResourceName] = o
		}
		s := p.owned[e.ResourceName]
		if s == nil {
			s = make(map[string]struct{})
			p.owned[e.ResourceName] = s
		}
		for _, id := range ids {
			o[id] = e.PodUID
			s[id] = struct{}{}
		}
		restored++
	}
	for name := range cp.Registered {
		if _, ok := m.resources[name]; ok || !IsExtendedResourceName(name) {
			continue
		}
		r := newResourceState(name)
		// Capacity stays zero until the plugin registers again; the
		// resource goes away after the grace period if it does not.
		r.stopTime = now
		r.listed = true
		m.resources[name] = r
	}
	m.log.Info("Restored device manager checkpoint", "entries", restored, "resources", len(cp.Registered))
}

func sameNUMA(have []int64, nodes []*pluginapi.NUMANode) bool {
	j := 0
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if j >= len(have) || have[j] != n.ID {
			return false
		}
		j++
	}
	return j == len(have)
}
