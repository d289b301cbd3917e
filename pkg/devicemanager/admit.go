package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/topology"
)

// Admit allocates devices to every container of pod in the kubelet's order
// (init containers, then app containers) and returns the pod's
// allocation. Devices of a non-restartable init container are reused by
// the containers after it; a restartable (sidecar) init container keeps
// its own. A container that already holds its devices (for example after
// a restart restored from the checkpoint) is not allocated again.
//
// On failure the devices allocated by this call are released and the
// error is an *AdmissionError whose Reason is UnexpectedAdmissionError or
// TopologyAffinityError. An admission cut short by ctx or by Stop is not
// the pod's failure and returns no *AdmissionError (interrupted).
func (m *Manager) Admit(ctx context.Context, pod *corev1.Pod) (*PodAllocation, error) {
	var (
		alloc *PodAllocation
		err   error
	)
	if m.cfg.AdmissionWait > 0 {
		alloc, err = m.admitHeld(ctx, pod)
	} else {
		alloc, err = m.admit(ctx, pod)
	}
	if err != nil {
		return nil, m.interrupted(ctx, pod, err)
	}
	return alloc, nil
}

// interrupted returns err, unless the admission failed while its caller
// gave up (ctx done) or the manager was stopping: a plugin's Allocate cut
// off by the node's own shutdown says nothing of the pod. A kubelet that
// stops writes nothing either, and its next run admits the pod again; a
// rejection here would fail a pod for good for the node's restart. The
// error then wraps ctx's cause or ErrNotStarted, and no *AdmissionError.
func (m *Manager) interrupted(ctx context.Context, pod *corev1.Pod, err error) error {
	var ae *AdmissionError
	if !errors.As(err, &ae) {
		return err
	}
	m.mu.Lock()
	stopping := m.stopping
	m.mu.Unlock()
	var cause error
	switch {
	case ctx.Err() != nil:
		cause = context.Cause(ctx)
	case stopping:
		cause = ErrNotStarted
	default:
		return err
	}
	return fmt.Errorf("admission of pod %s/%s interrupted (%s): %w", pod.Namespace, pod.Name, err.Error(), cause)
}

func (m *Manager) admit(ctx context.Context, pod *corev1.Pod) (*PodAllocation, error) {
	m.admitMu.Lock()
	defer m.admitMu.Unlock()
	m.mu.Lock()
	running := m.started && !m.stopping
	m.mu.Unlock()
	if !running {
		return nil, ErrNotStarted
	}
	uid := string(pod.UID)
	a := &admission{m: m, pod: pod, uid: uid, reuse: make(map[string]map[string]struct{})}
	err := a.run(ctx)
	if err != nil {
		m.mu.Lock()
		a.rollbackLocked()
		m.mu.Unlock()
	}
	if a.changed {
		if werr := m.writeCheckpoint(); werr != nil && err == nil {
			err = unexpected("", fmt.Errorf("failed to write checkpoint file %q: %w", "kubelet_internal_checkpoint", werr))
			m.mu.Lock()
			a.rollbackLocked()
			m.mu.Unlock()
			_ = m.writeCheckpoint()
		}
	}
	if err != nil {
		return nil, err
	}
	return m.PodAllocation(pod.UID), nil
}

type created struct{ container, resource string }

type admission struct {
	m     *Manager
	pod   *corev1.Pod
	uid   string
	reuse map[string]map[string]struct{} // resource -> devices reusable from init containers
	// created lists allocations made by this call, for rollback.
	created []created
	changed bool
	// podAffinity is the pod-scope affinity; hasPodAffinity tells it was
	// computed.
	podAffinity    topology.Mask
	hasPodAffinity bool
}

func (a *admission) run(ctx context.Context) error {
	m := a.m
	m.mu.Lock()
	for _, rn := range extendedRequests(a.pod) {
		if err := m.unknownHoldersLocked(a.uid, rn); err != nil {
			m.mu.Unlock()
			return unexpected("", err)
		}
	}
	m.mu.Unlock()
	if m.policy.Name() != topology.PolicyNone && m.cfg.TopologyScope == topology.ScopePod {
		m.mu.Lock()
		hints := m.podHintsLocked(a.pod)
		m.mu.Unlock()
		hint, ok := m.policy.Merge([]map[string][]topology.Hint{hints})
		if !ok {
			return &AdmissionError{Reason: ReasonTopologyAffinityError, Err: ErrTopologyAffinity}
		}
		a.podAffinity, a.hasPodAffinity = hint.Affinity, true
	}
	for i := range a.pod.Spec.InitContainers {
		c := &a.pod.Spec.InitContainers[i]
		if err := a.container(ctx, c); err != nil {
			return err
		}
		m.mu.Lock()
		held := a.heldLocked(c.Name)
		if podspec.IsSidecar(c) {
			a.dropReuse(held)
		} else {
			for rn, ids := range held {
				s := a.reuse[rn]
				if s == nil {
					s = make(map[string]struct{})
					a.reuse[rn] = s
				}
				for _, id := range ids {
					s[id] = struct{}{}
				}
			}
		}
		m.mu.Unlock()
	}
	for i := range a.pod.Spec.Containers {
		c := &a.pod.Spec.Containers[i]
		if err := a.container(ctx, c); err != nil {
			return err
		}
		m.mu.Lock()
		a.dropReuse(a.heldLocked(c.Name))
		m.mu.Unlock()
	}
	return nil
}

func (a *admission) heldLocked(container string) map[string][]string {
	out := make(map[string][]string)
	if p := a.m.pods[a.uid]; p != nil {
		for rn, ra := range p.containers[container] {
			out[rn] = ra.ids
		}
	}
	return out
}

func (a *admission) dropReuse(held map[string][]string) {
	for rn, ids := range held {
		for _, id := range ids {
			delete(a.reuse[rn], id)
		}
	}
}

// containerRequests returns the container's device plugin requests.
// Extended resources have requests equal to limits; limits are read, and
// requests when a resource has no limit.
func (m *Manager) containerRequestsLocked(c *corev1.Container) map[string]int {
	out := make(map[string]int)
	add := func(rl corev1.ResourceList, onlyMissing bool) {
		for name, q := range rl {
			rn := string(name)
			if _, ok := out[rn]; ok && onlyMissing {
				continue
			}
			if !m.isDevicePluginResourceLocked(rn) {
				continue
			}
			out[rn] = int(q.Value())
		}
	}
	add(c.Resources.Limits, false)
	add(c.Resources.Requests, true)
	return out
}

func (m *Manager) isDevicePluginResourceLocked(rn string) bool {
	if r, ok := m.resources[rn]; ok && r.listed {
		return true
	}
	_, ok := m.owner[rn]
	return ok
}

func (a *admission) container(ctx context.Context, c *corev1.Container) error {
	m := a.m
	m.mu.Lock()
	reqs := m.containerRequestsLocked(c)
	var affinity topology.Mask
	if len(reqs) > 0 && m.policy.Name() != topology.PolicyNone {
		if a.hasPodAffinity {
			affinity = a.podAffinity
		} else {
			hints := m.containerHintsLocked(a.uid, c.Name, reqs, a.reuse)
			hint, ok := m.policy.Merge([]map[string][]topology.Hint{hints})
			if !ok {
				m.mu.Unlock()
				return &AdmissionError{Reason: ReasonTopologyAffinityError, Container: c.Name, Err: ErrTopologyAffinity}
			}
			affinity = hint.Affinity
		}
	}
	m.mu.Unlock()
	for _, rn := range sortedKeys(reqs) {
		if reqs[rn] <= 0 {
			continue
		}
		if IsDRAExtendedResource(a.pod, c.Name, rn) {
			// The scheduler gave this container the resource through
			// DRA: the claim in status.extendedResourceClaimStatus is the
			// DRA manager's to prepare, and no device plugin allocates.
			m.log.Debug("Skipping allocation for DRA-backed extended resource", "resource", rn, "pod", a.pod.Namespace+"/"+a.pod.Name, "container", c.Name)
			continue
		}
		if err := a.allocate(ctx, c.Name, rn, reqs[rn], affinity); err != nil {
			return unexpected(c.Name, err)
		}
	}
	return nil
}

// allocate gives container `required` devices of resource rn, following
// the kubelet's devicesToAllocate and allocateContainerResources: checks
// of what the container already holds, then the choice of devices
// (choose), then the Allocate call (commit).
func (a *admission) allocate(ctx context.Context, cname, rn string, required int, affinity topology.Mask) error {
	m := a.m
	m.mu.Lock()
	r, done, err := a.checkLocked(cname, rn, required)
	if err != nil || done {
		m.mu.Unlock()
		return err
	}
	sel := &selection{a: a, r: r, rn: rn, chosen: make(map[string]struct{}), needed: required}
	// 1. Devices reusable from init containers.
	for _, id := range sortedSet(a.reuse[rn]) {
		if sel.needed == 0 {
			break
		}
		sel.take(id)
		sel.needed--
	}
	if sel.needed > 0 {
		if err := sel.choose(ctx, required, affinity); err != nil {
			m.mu.Unlock()
			return err
		}
	}
	return a.commitLocked(ctx, cname, sel)
}

// checkLocked applies the kubelet's checks before choosing devices: the
// resource is registered and has healthy devices, and a container that
// already holds devices of it asks for as many, all still healthy (then
// done: no second Allocate call).
func (a *admission) checkLocked(cname, rn string, required int) (r *resourceState, done bool, err error) {
	m := a.m
	var existing []string
	if p := m.pods[a.uid]; p != nil {
		if ra := p.containers[cname][rn]; ra != nil {
			existing = ra.ids
		}
	}
	if existing != nil && len(existing) != required {
		return nil, false, fmt.Errorf("pod %q container %q changed request for resource %q from %d to %d", a.uid, cname, rn, len(existing), required)
	}
	r = m.resources[rn]
	if r == nil {
		return nil, false, fmt.Errorf("cannot allocate unregistered device %s", rn)
	}
	if r.healthy == 0 {
		return nil, false, fmt.Errorf("no healthy devices present; cannot allocate unhealthy devices %s", rn)
	}
	for _, id := range existing {
		if d := r.devices[id]; d == nil || !d.healthy {
			return nil, false, fmt.Errorf("previously allocated devices are no longer healthy; cannot allocate unhealthy devices %s", rn)
		}
	}
	return r, existing != nil, nil
}

// choose reserves sel.needed free devices: topology-aligned ones first,
// the plugin's preferred allocation when it offers one, then the rest. It
// is called with m.mu held and returns with it held (it lets go of it
// around GetPreferredAllocation); on failure the devices it reserved are
// released.
func (sel *selection) choose(ctx context.Context, required int, affinity topology.Mask) error {
	r := sel.r
	available := r.freeCount()
	if available < sel.needed {
		return fmt.Errorf("requested number of devices unavailable for %s. Requested: %d, Available: %d", sel.rn, sel.needed, available)
	}
	useAffinity := affinity != 0 && r.groups.HasTopology()
	alignedCount := 0
	if useAffinity {
		for mask, p := range r.free {
			if mask.AnySet(affinity) {
				alignedCount += len(p.devs)
			}
		}
	}
	inAligned := func(d *device) bool { return useAffinity && d.mask.AnySet(affinity) }
	branchAligned := useAffinity && sel.needed < alignedCount
	if !branchAligned && useAffinity {
		// Not enough aligned devices: take them all first.
		sel.takeFree(inAligned)
	}
	if sel.needed > 0 && r.primary != nil && r.primary.opts.GetGetPreferredAllocationAvailable() {
		if err := sel.takePreferred(ctx, required, func(d *device) bool { return !branchAligned || inAligned(d) }); err != nil {
			sel.release()
			return err
		}
	}
	if branchAligned {
		sel.takeFree(inAligned)
	} else {
		sel.takeFree(func(d *device) bool { return d.mask != 0 && !inAligned(d) })
		sel.takeFree(func(*device) bool { return true })
	}
	if sel.needed > 0 {
		sel.release()
		return fmt.Errorf("unexpectedly allocated less resources than required. Requested: %d, Got: %d", required, required-sel.needed)
	}
	return nil
}

// takeFree reserves free devices that match, in NUMA mask order.
func (sel *selection) takeFree(match func(*device) bool) {
	for _, mask := range sortedMasks(sel.r.free) {
		for sel.needed > 0 {
			p := sel.r.free[mask]
			if p == nil || len(p.devs) == 0 || !match(p.devs[len(p.devs)-1]) {
				break
			}
			sel.reserve(p.devs[len(p.devs)-1])
		}
	}
}

// takePreferred asks the plugin's GetPreferredAllocation (available =
// the eligible free devices plus those chosen, mustInclude = those chosen,
// size = the container's request) and reserves what it names, skipping
// devices that are unknown, not free or not eligible.
func (sel *selection) takePreferred(ctx context.Context, required int, eligible func(*device) bool) error {
	m, r := sel.a.m, sel.r
	var candidates []string
	for _, p := range r.free {
		for _, d := range p.devs {
			if eligible(d) {
				candidates = append(candidates, d.id)
			}
		}
	}
	candidates = append(candidates, sel.order...)
	sort.Strings(candidates)
	mustInclude := append([]string(nil), sel.order...)
	sort.Strings(mustInclude)
	ep := r.primary
	m.mu.Unlock()
	preferred, err := m.preferred(ctx, ep, candidates, mustInclude, required)
	m.mu.Lock()
	if err != nil {
		return err
	}
	for _, id := range preferred {
		if sel.needed == 0 {
			break
		}
		d := r.devices[id]
		if d == nil || d.poolIdx < 0 || !eligible(d) {
			continue
		}
		sel.reserve(d)
	}
	return nil
}

// reserve marks d held by the pod and chosen.
func (sel *selection) reserve(d *device) {
	sel.a.m.reserveLocked(sel.r, d, sel.a.uid)
	sel.fresh = append(sel.fresh, d)
	sel.take(d.id)
	sel.needed--
}

// release frees the devices this selection reserved.
func (sel *selection) release() {
	for _, d := range sel.fresh {
		sel.a.m.releaseLocked(sel.rn, d.id, sel.a.uid)
	}
	sel.a.m.releaseUnreferencedLocked(sel.a.uid)
}

// commitLocked calls the plugin's Allocate with the chosen devices and
// records the answer for the container. Called with m.mu held; it lets go
// of it for the call and returns with it released.
func (a *admission) commitLocked(ctx context.Context, cname string, sel *selection) error {
	m, r := a.m, sel.r
	ep := r.primary
	ids := append([]string(nil), sel.order...)
	sort.Strings(ids)
	if ep == nil {
		sel.release()
		m.mu.Unlock()
		return fmt.Errorf("unknown Device Plugin %s", sel.rn)
	}
	m.mu.Unlock()

	resp, err := m.allocateRPC(ctx, ep, ids)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil && len(resp.GetContainerResponses()) == 0 {
		// The kubelet returns here without releasing the reserved devices
		// (kubernetes#130172); we release them.
		err = fmt.Errorf("no containers return in allocation response %v", resp)
	}
	if err != nil {
		sel.release()
		return err
	}
	cresp := resp.ContainerResponses[0]
	p := m.podLocked(a.uid)
	// Reused devices are owned by the pod already; fresh ones were reserved.
	if p.containers[cname] == nil {
		p.containers[cname] = make(map[string]*resAlloc)
	}
	p.containers[cname][sel.rn] = &resAlloc{ids: ids, numa: m.numaOf(r, ids), resp: cresp, raw: marshalResp(cresp)}
	a.created = append(a.created, created{cname, sel.rn})
	a.changed = true
	return nil
}

// rollbackLocked removes the allocations made by this admission.
func (a *admission) rollbackLocked() {
	p := a.m.pods[a.uid]
	if p == nil {
		return
	}
	for _, c := range a.created {
		if res := p.containers[c.container]; res != nil {
			delete(res, c.resource)
			if len(res) == 0 {
				delete(p.containers, c.container)
			}
		}
	}
	a.m.releaseUnreferencedLocked(a.uid)
	a.created = nil
}

// selection is the devices being chosen for one container and resource.
type selection struct {
	a      *admission
	r      *resourceState
	rn     string
	chosen map[string]struct{}
	order  []string
	// needed counts the devices still to choose; fresh are those reserved
	// by this selection (not reused from init containers).
	needed int
	fresh  []*device
}

func (s *selection) take(id string) {
	if _, ok := s.chosen[id]; ok {
		return
	}
	s.chosen[id] = struct{}{}
	s.order = append(s.order, id)
}

func sortedSet(s map[string]struct{}) []string {
	out := make([]string, 0, len(s))
	for k := range s {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedMasks(mp map[topology.Mask]*pool) []topology.Mask {
	out := make([]topology.Mask, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (m *Manager) preferred(ctx context.Context, e *endpoint, available, mustInclude []string, size int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AllocateTimeout)
	defer cancel()
	resp, err := e.api.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: available, MustIncludeDeviceIDs: mustInclude, AllocationSize: int32(size),
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("device plugin GetPreferredAllocation rpc failed with err: %w", err)
	}
	if len(resp.GetContainerResponses()) == 0 {
		return nil, nil
	}
	return resp.ContainerResponses[0].DeviceIDs, nil
}

// allocateRPC calls Allocate with the configured deadline; the kubelet
// sets none (kubernetes#129249).
func (m *Manager) allocateRPC(ctx context.Context, e *endpoint, ids []string) (*pluginapi.AllocateResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AllocateTimeout)
	defer cancel()
	return e.api.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
}

// containerHintsLocked computes per-resource hints for one container, like
// the kubelet's GetTopologyHints.
func (m *Manager) containerHintsLocked(uid, cname string, reqs map[string]int, reuse map[string]map[string]struct{}) map[string][]topology.Hint {
	out := make(map[string][]topology.Hint)
	for rn, requested := range reqs {
		r := m.resources[rn]
		if r == nil || !r.groups.HasTopology() {
			out[rn] = nil
			continue
		}
		var allocated []string
		if p := m.pods[uid]; p != nil {
			if ra := p.containers[cname][rn]; ra != nil {
				allocated = ra.ids
			}
		}
		if len(allocated) > 0 {
			if len(allocated) != requested {
				out[rn] = []topology.Hint{}
				continue
			}
			out[rn] = topology.DeviceHints(m.cfg.NUMANodes, r.groups, groupsOf(r, allocated), nil, requested)
			continue
		}
		reusable := groupsOf(r, sortedSet(reuse[rn]))
		avail := freeGroups(r)
		total := 0
		for _, n := range avail {
			total += n
		}
		if total+len(reuse[rn]) < requested {
			out[rn] = []topology.Hint{}
			continue
		}
		out[rn] = topology.DeviceHints(m.cfg.NUMANodes, r.groups, avail, reusable, requested)
	}
	return out
}

// podHintsLocked computes per-resource hints for the whole pod, like the
// kubelet's GetPodTopologyHints.
func (m *Manager) podHintsLocked(pod *corev1.Pod) map[string][]topology.Hint {
	reqs := m.podRequestsLocked(pod)
	out := make(map[string][]topology.Hint)
	for rn, requested := range reqs {
		r := m.resources[rn]
		if r == nil || !r.groups.HasTopology() {
			out[rn] = nil
			continue
		}
		var allocated []string
		if p := m.pods[string(pod.UID)]; p != nil {
			allocated = sortedSet(p.owned[rn])
		}
		if len(allocated) > 0 {
			if len(allocated) != requested {
				out[rn] = []topology.Hint{}
				continue
			}
			out[rn] = topology.DeviceHints(m.cfg.NUMANodes, r.groups, groupsOf(r, allocated), nil, requested)
			continue
		}
		if r.freeCount() < requested {
			out[rn] = []topology.Hint{}
			continue
		}
		out[rn] = topology.DeviceHints(m.cfg.NUMANodes, r.groups, freeGroups(r), nil, requested)
	}
	return out
}

// podRequestsLocked returns the pod-level device requests with the
// kubelet's rules for init and sidecar containers: the larger of the sum
// over app and sidecar containers and, for each init container, its
// request plus the sidecars started before it.
func (m *Manager) podRequestsLocked(pod *corev1.Pod) map[string]int {
	out := make(map[string]int)
	sidecars := make(map[string]int)
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		for rn, n := range m.containerRequestsLocked(c) {
			if podspec.IsSidecar(c) {
				sidecars[rn] += n
				continue
			}
			if v := n + sidecars[rn]; v > out[rn] {
				out[rn] = v
			}
		}
	}
	apps := make(map[string]int)
	for i := range pod.Spec.Containers {
		for rn, n := range m.containerRequestsLocked(&pod.Spec.Containers[i]) {
			apps[rn] += n
		}
	}
	for rn, n := range sidecars {
		apps[rn] += n
	}
	for rn, n := range apps {
		if n > out[rn] {
			out[rn] = n
		}
	}
	return out
}

func groupsOf(r *resourceState, ids []string) topology.DeviceGroups {
	g := make(topology.DeviceGroups)
	for _, id := range ids {
		if d := r.devices[id]; d != nil {
			g[d.mask]++
		} else {
			g[0]++
		}
	}
	return g
}

func freeGroups(r *resourceState) topology.DeviceGroups {
	g := make(topology.DeviceGroups, len(r.free))
	for mask, p := range r.free {
		g[mask] = len(p.devs)
	}
	return g
}

// RemovePod forgets the pod's allocations and frees its devices.
func (m *Manager) RemovePod(uid types.UID) {
	m.admitMu.Lock()
	defer m.admitMu.Unlock()
	m.forgetPod(string(uid))
	m.mu.Lock()
	p := m.pods[string(uid)]
	if p == nil {
		m.mu.Unlock()
		return
	}
	p.containers = map[string]map[string]*resAlloc{}
	m.releaseUnreferencedLocked(string(uid))
	m.mu.Unlock()
	_ = m.writeCheckpoint() // logged; the pod is gone either way
}

// forgetPod drops uid from the unknown holders of a lost checkpoint.
func (m *Manager) forgetPod(uid string) {
	m.mu.Lock()
	m.forgetUnknownLocked(uid)
	m.mu.Unlock()
}

// RetainPods removes every pod not in active, like the kubelet's
// UpdateAllocatedDevices with its active pods.
func (m *Manager) RetainPods(active []types.UID) {
	keep := make(map[string]struct{}, len(active))
	for _, u := range active {
		keep[string(u)] = struct{}{}
	}
	m.admitMu.Lock()
	defer m.admitMu.Unlock()
	m.mu.Lock()
	for _, holders := range m.unknown {
		for uid := range holders {
			if _, ok := keep[uid]; !ok {
				m.forgetUnknownLocked(uid)
			}
		}
	}
	removed := false
	for uid, p := range m.pods {
		if _, ok := keep[uid]; ok {
			continue
		}
		p.containers = map[string]map[string]*resAlloc{}
		m.releaseUnreferencedLocked(uid)
		removed = true
	}
	m.mu.Unlock()
	if removed {
		_ = m.writeCheckpoint() // logged; the pods are gone either way
	}
}

// IsDRAExtendedResource reports whether the scheduler gave container the
// extended resource rn of pod through DRA rather than a device plugin:
// the pod's status.extendedResourceClaimStatus maps the container's
// request of rn to a request of its claim. The kubelet (v1.37,
// isDRAExtendedResource) decides per pod this way, not by DeviceClass:
// on a node where a device plugin and a DeviceClass's
// extendedResourceName both give the name, the scheduler chooses per
// node (allocatable > 0: the device plugin), and the pod's status says
// which it chose. Such a request is not allocated by the device manager
// (Admit skips it); the DRA manager prepares the claim. Topology hints
// still count it, as the kubelet's GetTopologyHints does.
func IsDRAExtendedResource(pod *corev1.Pod, container, rn string) bool {
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil {
		return false
	}
	for _, m := range st.RequestMappings {
		if m.ContainerName == container && m.ResourceName == rn {
			return true
		}
	}
	return false
}
