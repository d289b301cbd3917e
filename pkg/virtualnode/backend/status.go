package backend

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// The two forwarders below are not the contract: they stay only until
// the node's own callers (pkg/virtualnode/dra.go) call podruntime, then
// go. New code calls podruntime.

// ComputeStatus is podruntime.ComputeStatus.
func ComputeStatus(pod *corev1.Pod, st *corev1.PodStatus, nodeIP string, deleting bool) {
	podruntime.ComputeStatus(pod, st, nodeIP, deleting)
}

// WaitingStatuses is podruntime.WaitingStatuses.
func WaitingStatuses(pod *corev1.Pod) (init, app []corev1.ContainerStatus) {
	return podruntime.WaitingStatuses(pod)
}
