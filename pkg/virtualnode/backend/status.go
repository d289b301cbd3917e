package backend

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// ComputeStatus is podruntime.ComputeStatus.
//
// Deprecated: use podruntime.ComputeStatus; kept until the node's own
// callers (pkg/virtualnode/dra.go) move to it.
func ComputeStatus(pod *corev1.Pod, st *corev1.PodStatus, nodeIP string, deleting bool) {
	podruntime.ComputeStatus(pod, st, nodeIP, deleting)
}

// WaitingStatuses is podruntime.WaitingStatuses.
//
// Deprecated: use podruntime.WaitingStatuses; kept until the node's own
// callers (pkg/virtualnode/dra.go) move to it.
func WaitingStatuses(pod *corev1.Pod) (init, app []corev1.ContainerStatus) {
	return podruntime.WaitingStatuses(pod)
}
