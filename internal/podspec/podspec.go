// Package podspec answers questions about a pod's spec that the device
// manager, the PodResources server, the emulator and the virtual node's
// pod runtime all ask, so each is answered once, as the kubelet does.
package podspec

import corev1 "k8s.io/api/core/v1"

// IsSidecar reports whether c, an init container, is a sidecar: its
// restartPolicy is Always, so it starts in order with the other init
// containers, keeps running beside the app containers and keeps its
// devices (the kubelet's podutil.IsRestartableInitContainer).
func IsSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// Container returns pod's init or app container named name, or nil.
func Container(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}
