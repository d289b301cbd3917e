package dramanager

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/pkg/dramanager/checkpoint"
)

// containerClaimStates returns copies of the claims container uses, in
// the order of the pod's spec, then the extended-resource claim.
func (m *Manager) containerClaimStates(pod *corev1.Pod, c *corev1.Container) ([]checkpoint.ClaimState, error) {
	_, order, err := containerClaims(pod, c)
	if err != nil {
		return nil, err
	}
	m.cache.mu.RLock()
	defer m.cache.mu.RUnlock()
	out := make([]checkpoint.ClaimState, 0, len(order))
	for _, name := range order {
		ci, ok := m.cache.get(pod.Namespace, name)
		if !ok {
			return nil, fmt.Errorf("unable to get information for ResourceClaim %s", name)
		}
		out = append(out, ci.ClaimState)
	}
	return out, nil
}

// GetDynamicResources reports the devices of the claims container uses,
// for the PodResources API (podresources.DynamicResourcesProvider). Each
// ClaimResource carries the CDI devices of its own device (the kubelet
// v1.37 gives the n-th device of a driver those of devices 1..n).
func (m *Manager) GetDynamicResources(pod *corev1.Pod, c *corev1.Container) []*podresourcesv1.DynamicResource {
	states, err := m.containerClaimStates(pod, c)
	if err != nil {
		m.log.Error("Unable to get container claim info state", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "err", err)
		return []*podresourcesv1.DynamicResource{}
	}
	var out []*podresourcesv1.DynamicResource
	for _, s := range states {
		var res []*podresourcesv1.ClaimResource
		for _, driver := range sortedKeys(s.DriverState) {
			for _, d := range s.DriverState[driver].Devices {
				var cdi []*podresourcesv1.CDIDevice
				for _, id := range d.CDIDeviceIDs {
					cdi = append(cdi, &podresourcesv1.CDIDevice{Name: id})
				}
				res = append(res, &podresourcesv1.ClaimResource{
					CdiDevices: cdi,
					DriverName: driver,
					PoolName:   d.PoolName,
					DeviceName: d.DeviceName,
					ShareId:    d.ShareID,
				})
			}
		}
		out = append(out, &podresourcesv1.DynamicResource{ClaimName: s.ClaimName, ClaimNamespace: s.Namespace, ClaimResources: res})
	}
	return out
}

// UpdateAllocatedResourcesStatus sets, in status, the health of the
// devices of every container's claims: one allocatedResourcesStatus entry
// named claim:<claim> or claim:<claim>/<request> per claim reference of
// the container, one resource per device, identified by its first CDI
// device ID or else <driver>/<pool>/<device>, as the kubelet.
func (m *Manager) UpdateAllocatedResourcesStatus(pod *corev1.Pod, status *corev1.PodStatus) {
	now := m.cfg.Clock.Now()
	claimNames := map[string]string{}
	for _, s := range status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			claimNames[s.Name] = *s.ResourceClaimName
		}
	}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil && claimNames[s.Name] == "" {
			claimNames[s.Name] = *s.ResourceClaimName
		}
	}
	for i := range status.ContainerStatuses {
		cs := &status.ContainerStatuses[i]
		idx := slices.IndexFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == cs.Name })
		if idx < 0 || len(pod.Spec.Containers[idx].Resources.Claims) == 0 {
			continue
		}
		spec := &pod.Spec.Containers[idx]
		byName := map[corev1.ResourceName]*corev1.ResourceStatus{}
		var names []corev1.ResourceName
		for j := range cs.AllocatedResourcesStatus {
			rs := cs.AllocatedResourcesStatus[j]
			byName[rs.Name] = &rs
			names = append(names, rs.Name)
		}
		for _, rc := range spec.Resources.Claims {
			actual := claimNames[rc.Name]
			if actual == "" {
				for k := range pod.Spec.ResourceClaims {
					if pod.Spec.ResourceClaims[k].Name == rc.Name {
						actual, _, _ = claimName(pod, &pod.Spec.ResourceClaims[k])
						break
					}
				}
			}
			if actual == "" {
				continue
			}
			m.cache.mu.RLock()
			ci, ok := m.cache.get(pod.Namespace, actual)
			var st checkpoint.ClaimState
			if ok {
				st = ci.ClaimState
			}
			m.cache.mu.RUnlock()
			if !ok {
				continue
			}
			name := corev1.ResourceName("claim:" + rc.Name)
			if rc.Request != "" {
				name = corev1.ResourceName("claim:" + rc.Name + "/" + rc.Request)
			}
			rs := byName[name]
			if rs == nil {
				rs = &corev1.ResourceStatus{Name: name}
				byName[name] = rs
				names = append(names, name)
			}
			rs.Resources = []corev1.ResourceHealth{}
			seen := map[corev1.ResourceID]bool{}
			for _, driver := range sortedKeys(st.DriverState) {
				for _, d := range st.DriverState[driver].Devices {
					if rc.Request != "" && len(d.RequestNames) > 0 && !slices.Contains(d.RequestNames, baseRequest(rc.Request)) {
						continue
					}
					h := m.health.get(driver, d.PoolName, d.DeviceName, now, m.cfg.HealthTimeout)
					rh := corev1.ResourceHealth{Health: corev1.ResourceHealthStatus(h.Health)}
					if h.Message != "" {
						msg := h.Message
						rh.Message = &msg
					}
					if len(d.CDIDeviceIDs) > 0 {
						rh.ResourceID = corev1.ResourceID(d.CDIDeviceIDs[0])
					} else {
						rh.ResourceID = corev1.ResourceID(driver + "/" + d.PoolName + "/" + d.DeviceName)
					}
					if seen[rh.ResourceID] {
						continue
					}
					seen[rh.ResourceID] = true
					rs.Resources = append(rs.Resources, rh)
				}
			}
		}
		var final []corev1.ResourceStatus
		for _, n := range names {
			if rs := byName[n]; len(rs.Resources) > 0 {
				final = append(final, *rs)
			}
		}
		cs.AllocatedResourcesStatus = final
	}
}
