package virtualnode

import (
	"context"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// extendedResourceName returns the extended resource name a DeviceClass
// gives its devices: spec.extendedResourceName, or the implicit
// deviceclass.resource.kubernetes.io/<class>.
func extendedResourceName(dc *resourcev1.DeviceClass) string {
	if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName != "" {
		return *dc.Spec.ExtendedResourceName
	}
	return resourcev1.ResourceDeviceClassPrefix + dc.Name
}

// warnServedBothWays logs a warning for each of names, device-plugin
// resources new on the node, that a DeviceClass also maps to DRA. A node
// must not advertise one name both ways (KEP-5004); the kubelet does
// nothing about it, and neither does the node: the scheduler's rule
// (v1.37) serves the name on this node by the device plugin while its
// allocatable is above zero, and by DRA only when it is zero. The check
// is one List of DeviceClasses each time new names register; a node
// identity may not read DeviceClasses (the system:node role has no rule
// for them), and is told once at debug level.
func (n *Node) warnServedBothWays(ctx context.Context, names []string) {
	if len(names) == 0 {
		return
	}
	list, err := n.cfg.Client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			n.classesOnce.Do(func() {
				n.log.Debug("Cannot read DeviceClasses to check that no device-plugin resource is also DRA-backed", "err", err)
			})
			return
		}
		n.log.Warn("Reading DeviceClasses to check that no device-plugin resource is also DRA-backed", "err", err)
		return
	}
	for i := range list.Items {
		dc := &list.Items[i]
		rn := extendedResourceName(dc)
		if !slices.Contains(names, rn) {
			continue
		}
		n.log.Warn("A device plugin serves an extended resource that a DeviceClass maps to DRA; a node must not advertise one name both ways. "+
			"The scheduler serves it on this node by the device plugin while its allocatable is above zero, by DRA when it is zero",
			"resource", rn, "deviceClass", dc.Name)
	}
}

// newPluginNames returns the device-plugin resources in capacity that
// warnServedBothWays has not checked yet, and marks them checked.
func (n *Node) newPluginNames(capacity map[string]int64) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.classChecked == nil {
		n.classChecked = map[string]bool{}
	}
	var out []string
	for rn := range capacity {
		if !n.classChecked[rn] {
			n.classChecked[rn] = true
			out = append(out, rn)
		}
	}
	slices.Sort(out)
	return out
}
