package draverify

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/utils/ptr"
)

// Which ResourceSlices offer devices to the run's node: the scheduler's
// rule (k8s.io/dynamic-resource-allocation/structured, GatherPools and
// NodeMatches). A slice is for the node when its spec.nodeName is the
// node, its spec.allNodes is set, its spec.nodeSelector matches the Node
// (labels or the metadata.name field), or, with
// spec.perDeviceNodeSelection, when one of its devices' nodeName,
// allNodes or nodeSelector does; slices with sharedCounters belong to
// every node of their pool.

// nodeMatches is the scheduler's NodeMatches.
func nodeMatches(node *corev1.Node, nodeName string, allNodes bool, sel *corev1.NodeSelector) bool {
	switch {
	case nodeName != "":
		return node.Name == nodeName
	case allNodes:
		return true
	case sel != nil:
		ns, err := nodeaffinity.NewNodeSelector(sel)
		return err == nil && ns.Match(node)
	}
	return false
}

// deviceForNode tells whether a device of slice s is offered to node.
func deviceForNode(s *resourcev1.ResourceSlice, d *resourcev1.Device, node *corev1.Node) bool {
	if !ptr.Deref(s.Spec.PerDeviceNodeSelection, false) {
		return sliceForNode(s, node)
	}
	return nodeMatches(node, ptr.Deref(d.NodeName, ""), ptr.Deref(d.AllNodes, false), d.NodeSelector)
}

// sliceForNode tells whether s offers devices to node.
func sliceForNode(s *resourcev1.ResourceSlice, node *corev1.Node) bool {
	spec := &s.Spec
	if nodeName, all := ptr.Deref(spec.NodeName, ""), ptr.Deref(spec.AllNodes, false); nodeName != "" || all || spec.NodeSelector != nil {
		return nodeMatches(node, nodeName, all, spec.NodeSelector)
	}
	if ptr.Deref(spec.PerDeviceNodeSelection, false) {
		for i := range spec.Devices {
			if deviceForNode(s, &spec.Devices[i], node) {
				return true
			}
		}
	}
	return false
}

// nodeSelection names the field by which s selects its nodes.
func nodeSelection(s *resourcev1.ResourceSlice) string {
	switch {
	case s.Spec.NodeName != nil:
		return "spec.nodeName"
	case ptr.Deref(s.Spec.AllNodes, false):
		return "spec.allNodes"
	case s.Spec.NodeSelector != nil:
		return "spec.nodeSelector"
	case ptr.Deref(s.Spec.PerDeviceNodeSelection, false):
		return "spec.perDeviceNodeSelection"
	}
	return "sharedCounters"
}

// forNode keeps the slices of sl that are for node, with the
// sharedCounters slices of their pools.
func forNode(sl []resourcev1.ResourceSlice, node *corev1.Node) []resourcev1.ResourceSlice {
	pools := map[string]bool{}
	var out []resourcev1.ResourceSlice
	for i := range sl {
		if sliceForNode(&sl[i], node) {
			pools[sl[i].Spec.Driver+"/"+sl[i].Spec.Pool.Name] = true
			out = append(out, sl[i])
		}
	}
	for i := range sl {
		if len(sl[i].Spec.SharedCounters) > 0 && pools[sl[i].Spec.Driver+"/"+sl[i].Spec.Pool.Name] && !slices.ContainsFunc(out, func(o resourcev1.ResourceSlice) bool { return o.Name == sl[i].Name }) {
			out = append(out, sl[i])
		}
	}
	return out
}

// nodeObject returns the run's Node as the API server has it (its labels are
// what node selectors match), read once; a Node with nothing but its
// name when it cannot be read.
func (r *run) nodeObject(ctx context.Context) *corev1.Node {
	if r.nodeObj != nil {
		return r.nodeObj
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	n, err := r.client.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
	if err != nil {
		r.log.Debug("Cannot read the Node", "node", r.node, "err", err)
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: r.node}}
	}
	r.nodeObj = n
	return n
}
