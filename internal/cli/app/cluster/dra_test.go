package cluster

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/internal/cli"
)

// TestDRA: claims in their three API states (pending, allocated on the
// node the scheduler's selector names, reserved for a pod), slices with
// their node, pool, generation and devices, and one claim as JSON.
func TestDRA(t *testing.T) {
	t.Parallel()
	nodeSel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}}}}}}
	alloc := &resourcev1.AllocationResult{NodeSelector: nodeSel, Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0"}}}}
	r := DRA(fake.NewClientset(
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "pending"}},
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "alloc"}, Status: resourcev1.ResourceClaimStatus{Allocation: alloc}},
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "web", Name: "held"}, Status: resourcev1.ResourceClaimStatus{Allocation: alloc,
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "train", UID: "u1"}}}},
		&resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s1"}, Spec: resourcev1.ResourceSliceSpec{Driver: "gpu.example.com", NodeName: ptr.To("node-a"),
			Pool: resourcev1.ResourcePool{Name: "node-a", Generation: 2, ResourceSliceCount: 1}, Devices: []resourcev1.Device{{Name: "gpu-0"}, {Name: "gpu-1"}}}},
		&resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "s2"}, Spec: resourcev1.ResourceSliceSpec{Driver: "net.example.com", AllNodes: ptr.To(true),
			Pool: resourcev1.ResourcePool{Name: "fabric", ResourceSliceCount: 1}}},
	))
	ctx := context.Background()
	claims, err := r.Claims(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	dev := []cli.ClaimDevice{{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0"}}
	want := map[string]cli.Claim{
		"pending": {Namespace: "ml", Name: "pending", State: cli.ClaimPending},
		"alloc":   {Namespace: "ml", Name: "alloc", State: cli.ClaimAllocated, Node: "node-a", Devices: dev},
		"held":    {Namespace: "web", Name: "held", State: cli.ClaimReserved, Node: "node-a", Devices: dev, ReservedFor: []string{"train"}},
	}
	if len(claims) != len(want) {
		t.Fatalf("Claims = %+v, want %d", claims, len(want))
	}
	for _, c := range claims {
		if !reflect.DeepEqual(c, want[c.Name]) {
			t.Errorf("claim %s = %+v, want %+v", c.Name, c, want[c.Name])
		}
	}
	if ml, err := r.Claims(ctx, "ml"); err != nil || len(ml) != 2 {
		t.Errorf("Claims(ml) = %+v, %v; want the 2 claims of ml", ml, err)
	}
	slices, err := r.Slices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantSlices := map[string]cli.Slice{
		"s1": {Name: "s1", Node: "node-a", Driver: "gpu.example.com", Pool: "node-a", Generation: 2, Devices: []string{"gpu-0", "gpu-1"}},
		"s2": {Name: "s2", Node: "*", Driver: "net.example.com", Pool: "fabric", Devices: []string{}},
	}
	for _, s := range slices {
		if !reflect.DeepEqual(s, wantSlices[s.Name]) {
			t.Errorf("slice %s = %+v, want %+v", s.Name, s, wantSlices[s.Name])
		}
	}
	data, err := r.ClaimJSON(ctx, "web", "held")
	if err != nil {
		t.Fatal(err)
	}
	var back resourcev1.ResourceClaim
	if err := json.Unmarshal(data, &back); err != nil || back.Status.ReservedFor[0].UID != "u1" {
		t.Errorf("ClaimJSON = %s (%v), want the claim with its reservation", data, err)
	}
	if _, err := r.ClaimJSON(ctx, "web", "gone"); err == nil {
		t.Error("ClaimJSON of a claim not there: no error")
	}
}
