package draverify

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The slices for a node are the scheduler's: by spec.nodeName,
// spec.allNodes, spec.nodeSelector (labels or the metadata.name field) or
// per device.
func TestSlicesForNode(t *testing.T) {
	t.Parallel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{"zone": "z1"}}}
	selector := func(r corev1.NodeSelectorRequirement, field bool) *corev1.NodeSelector {
		term := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{r}}
		if field {
			term = corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{r}}
		}
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{term}}
	}
	in := func(key string, values ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: key, Operator: corev1.NodeSelectorOpIn, Values: values}
	}
	dev := func(name string, nodeName *string) resourcev1.Device {
		return resourcev1.Device{Name: name, NodeName: nodeName}
	}
	tests := []struct {
		name    string
		spec    resourcev1.ResourceSliceSpec
		want    bool
		devices []string // the devices for the node
	}{
		{"nodeName", resourcev1.ResourceSliceSpec{NodeName: ptr.To("node-a"), Devices: []resourcev1.Device{dev("a", nil)}}, true, []string{"a"}},
		{"other nodeName", resourcev1.ResourceSliceSpec{NodeName: ptr.To("node-b"), Devices: []resourcev1.Device{dev("a", nil)}}, false, nil},
		{"allNodes", resourcev1.ResourceSliceSpec{AllNodes: ptr.To(true), Devices: []resourcev1.Device{dev("a", nil)}}, true, []string{"a"}},
		{"nodeSelector on metadata.name", resourcev1.ResourceSliceSpec{NodeSelector: selector(in("metadata.name", "node-a"), true), Devices: []resourcev1.Device{dev("a", nil)}}, true, []string{"a"}},
		{"nodeSelector on another name", resourcev1.ResourceSliceSpec{NodeSelector: selector(in("metadata.name", "node-b"), true), Devices: []resourcev1.Device{dev("a", nil)}}, false, nil},
		{"nodeSelector on a label", resourcev1.ResourceSliceSpec{NodeSelector: selector(in("zone", "z1"), false), Devices: []resourcev1.Device{dev("a", nil)}}, true, []string{"a"}},
		{"nodeSelector on another label", resourcev1.ResourceSliceSpec{NodeSelector: selector(in("zone", "z2"), false), Devices: []resourcev1.Device{dev("a", nil)}}, false, nil},
		{"per device", resourcev1.ResourceSliceSpec{PerDeviceNodeSelection: ptr.To(true), Devices: []resourcev1.Device{dev("a", ptr.To("node-a")), dev("b", ptr.To("node-b"))}}, true, []string{"a"}},
		{"per device, none for the node", resourcev1.ResourceSliceSpec{PerDeviceNodeSelection: ptr.To(true), Devices: []resourcev1.Device{dev("b", ptr.To("node-b"))}}, false, nil},
		{"no node selection", resourcev1.ResourceSliceSpec{Devices: []resourcev1.Device{dev("a", nil)}}, false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.spec.Driver, tc.spec.Pool = "d.example.com", resourcev1.ResourcePool{Name: "pool", Generation: 1, ResourceSliceCount: 1}
			s := resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s"}, Spec: tc.spec}
			if got := sliceForNode(&s, node); got != tc.want {
				t.Errorf("sliceForNode = %v, want %v", got, tc.want)
			}
			got := deviceNames(forNode([]resourcev1.ResourceSlice{s}, node), "pool", node)
			if len(got) != len(tc.devices) || (len(got) > 0 && got[0] != tc.devices[0]) {
				t.Errorf("devices for the node %q, want %q", got, tc.devices)
			}
		})
	}
}
