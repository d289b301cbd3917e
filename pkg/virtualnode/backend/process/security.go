package process

import (
	"fmt"
	"os"

	corev1 "k8s.io/api/core/v1"
)

// identity is who a container's processes run as.
type identity struct {
	uid, gid uint32
	groups   []uint32
	// other is set when that differs from the node's own user and group,
	// which needs the node to run as root.
	other bool
}

// podRef formats a pod as the kubelet's messages do: name_namespace(uid).
func podRef(pod *corev1.Pod) string {
	return fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
}

// containerIdentity applies the pod's and the container's securityContext
// (the container's fields win) as the kubelet does for runAsUser,
// runAsGroup, supplementalGroups and runAsNonRoot. The process backend has
// no image: a container without runAsUser runs as the node's own user, so
// runAsNonRoot refuses it when the node runs as root, with the kubelet's
// message. Running as another user needs the node to run as root.
func containerIdentity(pod *corev1.Pod, c *corev1.Container) (identity, error) {
	node := identity{uid: uint32(os.Getuid()), gid: uint32(os.Getgid())}
	var runAsUser, runAsGroup *int64
	var nonRoot *bool
	var groups []int64
	if psc := pod.Spec.SecurityContext; psc != nil {
		runAsUser, runAsGroup, nonRoot, groups = psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot, psc.SupplementalGroups
	}
	if csc := c.SecurityContext; csc != nil {
		if csc.RunAsUser != nil {
			runAsUser = csc.RunAsUser
		}
		if csc.RunAsGroup != nil {
			runAsGroup = csc.RunAsGroup
		}
		if csc.RunAsNonRoot != nil {
			nonRoot = csc.RunAsNonRoot
		}
	}
	if nonRoot != nil && *nonRoot {
		switch {
		case runAsUser != nil && *runAsUser == 0:
			return identity{}, fmt.Errorf("container's runAsUser breaks non-root policy (pod: %q, container: %s)", podRef(pod), c.Name)
		case runAsUser == nil && node.uid == 0:
			return identity{}, fmt.Errorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", podRef(pod), c.Name)
		}
	}
	id := node
	if runAsUser != nil {
		id.uid = uint32(*runAsUser)
	}
	if runAsGroup != nil {
		id.gid = uint32(*runAsGroup)
	} else if runAsUser != nil && id.uid != node.uid {
		// Without runAsGroup the kubelet uses the image's group; with no
		// image, the user's own number is the closest thing.
		id.gid = id.uid
	}
	for _, g := range groups {
		id.groups = append(id.groups, uint32(g))
	}
	id.other = id.uid != node.uid || id.gid != node.gid || len(id.groups) > 0
	if id.other && node.uid != 0 {
		return identity{}, fmt.Errorf("container %s asks to run as uid %d gid %d (groups %v) but dpkit node runs as uid %d: run the node as root to honour runAsUser, runAsGroup and supplementalGroups",
			c.Name, id.uid, id.gid, id.groups, node.uid)
	}
	return id, nil
}
