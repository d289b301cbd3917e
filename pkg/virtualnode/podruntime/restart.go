package podruntime

import (
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/internal/podspec"
)

// DefaultGracePeriod is the termination grace period of a pod that names
// none.
const DefaultGracePeriod = 30 * time.Second

// GracePeriod is how long a deleted pod's containers have to stop: its
// deletion grace period, else its terminationGracePeriodSeconds, else
// DefaultGracePeriod.
func GracePeriod(pod *corev1.Pod) time.Duration {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return DefaultGracePeriod
}

// ShouldRestart applies the pod's restartPolicy to container c (an init
// container when init) that exited with code, as the kubelet's
// ShouldContainerBeRestarted: a sidecar always restarts; an init
// container restarts on failure unless the policy is Never (Always is
// OnFailure for it); an app container as the policy says (unset is
// Always).
func ShouldRestart(pod *corev1.Pod, c *corev1.Container, init bool, code int32) bool {
	if init && podspec.IsSidecar(c) {
		return true
	}
	switch pod.Spec.RestartPolicy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return code != 0
	default:
		return !init || code != 0
	}
}
