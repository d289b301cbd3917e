package devicemanager

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// AllocatedResourcesStatus returns the health of the pod's devices in the
// shape of the pod status field allocatedResourcesStatus (KEP-4680), by
// container name: for each container holding devices, one entry per
// resource (sorted by name) with one resourceID per device (sorted). It
// returns nil when the pod holds no devices.
//
// A device is Healthy or Unhealthy as its plugin last reported it, and
// Unknown when the device manager cannot know: no plugin serves the
// resource (the plugin went away and has not registered again, or the
// resource was removed after the grace period), the plugin that registered
// again has not sent its device list yet, or its list no longer has the
// device. This is what the API documents ("Unknown: ... Device Plugin got
// unregistered and hasn't been re-registered since"). The kubelet (v1.37,
// devicemanager.UpdateAllocatedResourcesStatus) never reports Unknown for
// device plugins: it keeps the last reported health while the plugin is
// away and falls back to Healthy once the resource or the device is gone.
func (m *Manager) AllocatedResourcesStatus(podUID types.UID) map[string][]corev1.ResourceStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pods[string(podUID)]
	if p == nil || len(p.containers) == 0 {
		return nil
	}
	out := make(map[string][]corev1.ResourceStatus, len(p.containers))
	for _, cn := range sortedKeys(p.containers) {
		res := p.containers[cn]
		statuses := make([]corev1.ResourceStatus, 0, len(res))
		for _, rn := range sortedKeys(res) {
			r := m.resources[rn]
			st := corev1.ResourceStatus{Name: corev1.ResourceName(rn), Resources: make([]corev1.ResourceHealth, 0, len(res[rn].ids))}
			for _, id := range res[rn].ids { // sorted
				st.Resources = append(st.Resources, corev1.ResourceHealth{ResourceID: corev1.ResourceID(id), Health: r.healthOf(id)})
			}
			statuses = append(statuses, st)
		}
		out[cn] = statuses
	}
	return out
}

// healthOf is what the manager knows of device id's health; r may be nil
// (the resource is unknown).
func (r *resourceState) healthOf(id string) corev1.ResourceHealthStatus {
	if r == nil || len(r.endpoints) == 0 || !r.reported {
		return corev1.ResourceHealthStatusUnknown
	}
	d := r.devices[id]
	switch {
	case d == nil:
		return corev1.ResourceHealthStatusUnknown
	case d.healthy:
		return corev1.ResourceHealthStatusHealthy
	default:
		return corev1.ResourceHealthStatusUnhealthy
	}
}
