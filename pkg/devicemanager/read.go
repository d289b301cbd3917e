package devicemanager

import (
	"context"
	"fmt"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Resources returns every known resource, sorted by name. Resources whose
// grace period has expired are removed first.
func (m *Manager) Resources() []ResourceStatus {
	m.mu.Lock()
	changed := m.collectExpiredLocked()
	out := make([]ResourceStatus, 0, len(m.resources))
	for _, name := range sortedKeys(m.resources) {
		r := m.resources[name]
		if !r.listed && len(r.endpoints) > 0 {
			// Connected, no list yet: the kubelet reports nothing. (A
			// plugin gone before its first list leaves the resource
			// at zero until the grace period ends, as in the kubelet.)
			continue
		}
		out = append(out, ResourceStatus{
			Name:        name,
			Capacity:    int64(len(r.devices)),
			Allocatable: int64(r.healthy),
			InUse:       int64(len(m.owner[name])),
			Connected:   len(r.endpoints) > 0,
		})
	}
	m.mu.Unlock()
	if changed {
		_ = m.writeCheckpoint() // logged
	}
	return out
}

// Capacity returns capacity (all devices) and allocatable (healthy devices)
// per resource, as the kubelet reports them in Node status.
func (m *Manager) Capacity() (capacity, allocatable map[string]int64) {
	capacity, allocatable = make(map[string]int64), make(map[string]int64)
	for _, r := range m.Resources() {
		capacity[r.Name] = r.Capacity
		allocatable[r.Name] = r.Allocatable
	}
	return capacity, allocatable
}

// Devices returns the devices of a resource sorted by ID, nil when the
// resource is unknown.
func (m *Manager) Devices(resource string) []Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resources[resource]
	if r == nil {
		return nil
	}
	out := make([]Device, 0, len(r.devices))
	for _, d := range r.devices {
		out = append(out, Device{ID: d.id, Healthy: d.healthy, NUMANodes: append([]int64(nil), d.numa...), PodUID: m.owner[resource][d.id]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PodAllocation returns the pod's devices, nil when it holds none.
func (m *Manager) PodAllocation(uid types.UID) *PodAllocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.podAllocationLocked(string(uid))
}

// Pods returns the allocations of every pod holding devices, sorted by UID.
func (m *Manager) Pods() []PodAllocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PodAllocation, 0, len(m.pods))
	for _, uid := range sortedKeys(m.pods) {
		if pa := m.podAllocationLocked(uid); pa != nil {
			out = append(out, *pa)
		}
	}
	return out
}

func (m *Manager) podAllocationLocked(uid string) *PodAllocation {
	p := m.pods[uid]
	if p == nil || len(p.containers) == 0 {
		return nil
	}
	pa := &PodAllocation{PodUID: uid}
	for _, cn := range sortedKeys(p.containers) {
		ca := ContainerAllocation{Name: cn}
		for _, rn := range sortedKeys(p.containers[cn]) {
			a := p.containers[cn][rn]
			numa := make(map[int64][]string, len(a.numa))
			for n, ids := range a.numa {
				numa[n] = append([]string(nil), ids...)
			}
			ca.Resources = append(ca.Resources, ResourceAllocation{
				Resource: rn, DeviceIDs: append([]string(nil), a.ids...), NUMANodes: numa, Response: a.resp,
			})
		}
		pa.Containers = append(pa.Containers, ca)
	}
	return pa
}

// ContainerOptions merges the plugins' Allocate answers for a container
// with the kubelet's rules: resources in name order, and within them
// environment variables and annotations in key order; the first value of a
// variable, annotation, device (by container path) or mount (by container
// path) wins and later conflicting ones are logged and dropped; CDI device
// names are de-duplicated. It returns nil when the container holds no
// devices.
func (m *Manager) ContainerOptions(podUID types.UID, container string) *ContainerOptions {
	m.mu.Lock()
	var allocs []*resAlloc
	var names []string
	if p := m.pods[string(podUID)]; p != nil {
		for _, rn := range sortedKeys(p.containers[container]) {
			allocs = append(allocs, p.containers[container][rn])
			names = append(names, rn)
		}
	}
	m.mu.Unlock()
	if len(allocs) == 0 {
		return nil
	}
	opts := &ContainerOptions{}
	envs, devs, mounts, annotations, cdi := map[string]string{}, map[string]string{}, map[string]string{}, map[string]string{}, map[string]struct{}{}
	for i, a := range allocs {
		resp := a.resp
		for _, k := range sortedKeys(resp.GetEnvs()) {
			v := resp.Envs[k]
			if keepFirst(envs, k, v, func(old string) {
				m.log.Error("Environment variable has conflicting settings", "resource", names[i], "name", k, "kept", old, "dropped", v)
			}) {
				opts.Envs = append(opts.Envs, KeyValue{k, v})
			}
		}
		for _, d := range resp.GetDevices() {
			if keepFirst(devs, d.ContainerPath, d.HostPath, func(old string) {
				m.log.Error("Container device has conflicting host devices", "resource", names[i], "containerPath", d.ContainerPath, "kept", old, "dropped", d.HostPath)
			}) {
				opts.Devices = append(opts.Devices, DeviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
			}
		}
		for _, mt := range resp.GetMounts() {
			if keepFirst(mounts, mt.ContainerPath, mt.HostPath, func(old string) {
				m.log.Error("Container mount has conflicting host paths", "resource", names[i], "containerPath", mt.ContainerPath, "kept", old, "dropped", mt.HostPath)
			}) {
				opts.Mounts = append(opts.Mounts, Mount{ContainerPath: mt.ContainerPath, HostPath: mt.HostPath, ReadOnly: mt.ReadOnly})
			}
		}
		for _, k := range sortedKeys(resp.GetAnnotations()) {
			v := resp.Annotations[k]
			if keepFirst(annotations, k, v, func(old string) {
				m.log.Error("Annotation has conflicting settings", "resource", names[i], "name", k, "kept", old, "dropped", v)
			}) {
				opts.Annotations = append(opts.Annotations, KeyValue{k, v})
			}
		}
		for _, c := range resp.GetCdiDevices() {
			if c == nil {
				continue
			}
			if _, ok := cdi[c.Name]; ok {
				continue
			}
			cdi[c.Name] = struct{}{}
			opts.CDIDevices = append(opts.CDIDevices, c.Name)
		}
	}
	return opts
}

// PreStartContainer calls PreStartContainer on the plugins that asked for
// it (DevicePluginOptions.PreStartRequired) with the container's devices,
// each call bounded by Config.PreStartTimeout. Call it before starting each
// container.
//
// As in the kubelet, a resource whose plugin is disconnected (or, after a
// restart, has not registered again) keeps its last options: a plugin that
// never asked for PreStart is skipped, one that did makes the call fail
// because its endpoint is stopped. Only a resource the manager no longer
// knows at all is "endpoint not found in cache".
func (m *Manager) PreStartContainer(ctx context.Context, podUID types.UID, container string) error {
	type call struct {
		rn  string
		ep  *endpoint
		ids []string
	}
	var calls []call
	m.mu.Lock()
	if p := m.pods[string(podUID)]; p != nil {
		for _, rn := range sortedKeys(p.containers[container]) {
			r := m.resources[rn]
			if r == nil {
				m.mu.Unlock()
				return fmt.Errorf("endpoint not found in cache for a registered resource: %s", rn)
			}
			if !r.opts.GetPreStartRequired() {
				continue
			}
			if r.primary == nil {
				m.mu.Unlock()
				return fmt.Errorf("device plugin PreStartContainer rpc failed with err: endpoint of %s has been stopped", rn)
			}
			calls = append(calls, call{rn, r.primary, p.containers[container][rn].ids})
		}
	}
	m.mu.Unlock()
	for _, c := range calls {
		cctx, cancel := context.WithTimeout(ctx, m.cfg.PreStartTimeout)
		_, err := c.ep.api.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: c.ids})
		cancel()
		if err != nil {
			return fmt.Errorf("device plugin PreStartContainer rpc failed with err: %w", err)
		}
	}
	return nil
}

// GetDevices returns the container's devices in the PodResources v1 shape:
// one entry per device and NUMA node, entries without topology for devices
// without NUMA information. Like the kubelet's DevicesProvider.GetDevices.
func (m *Manager) GetDevices(podUID, containerName string) []*podresourcesv1.ContainerDevices {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[podUID]
	if p == nil {
		return nil
	}
	var out []*podresourcesv1.ContainerDevices
	for _, rn := range sortedKeys(p.containers[containerName]) {
		a := p.containers[containerName][rn]
		nodes := make([]int64, 0, len(a.numa))
		for n := range a.numa {
			nodes = append(nodes, n)
		}
		sort.Slice(nodes, func(i, j int) bool { return nodes[i] < nodes[j] })
		for _, n := range nodes {
			ids := append([]string(nil), a.numa[n]...)
			sort.Strings(ids)
			for _, id := range ids {
				out = append(out, containerDevice(rn, id, n))
			}
		}
	}
	return out
}

// GetAllocatableDevices returns every healthy device in the PodResources v1
// shape, like the kubelet's DevicesProvider.GetAllocatableDevices.
func (m *Manager) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*podresourcesv1.ContainerDevices
	for _, rn := range sortedKeys(m.resources) {
		r := m.resources[rn]
		ids := make([]string, 0, r.healthy)
		for id, d := range r.devices {
			if d.healthy {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		for _, id := range ids {
			d := r.devices[id]
			if len(d.numa) == 0 {
				out = append(out, containerDevice(rn, id, nodeWithoutTopology))
				continue
			}
			for _, n := range d.numa {
				out = append(out, containerDevice(rn, id, n))
			}
		}
	}
	return out
}

func containerDevice(rn, id string, node int64) *podresourcesv1.ContainerDevices {
	cd := &podresourcesv1.ContainerDevices{ResourceName: rn, DeviceIds: []string{id}}
	if node != nodeWithoutTopology {
		cd.Topology = &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: node}}}
	}
	return cd
}

// keepFirst records value under key unless key is already taken, the
// kubelet's "first resource wins" rule for runtime options, and reports
// whether it did. A different value under a taken key is dropped and
// handed to conflict with the value kept.
func keepFirst(seen map[string]string, key, value string, conflict func(kept string)) bool {
	if old, ok := seen[key]; ok {
		if old != value {
			conflict(old)
		}
		return false
	}
	seen[key] = value
	return true
}
