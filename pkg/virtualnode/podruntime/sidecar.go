package podruntime

import corev1 "k8s.io/api/core/v1"

// IsSidecar reports whether c, an init container, is a sidecar: its
// restartPolicy is Always, so it starts in order with the other init
// containers and keeps running beside the app containers (the kubelet's
// podutil.IsRestartableInitContainer).
func IsSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}
