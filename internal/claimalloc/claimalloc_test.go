package claimalloc_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/internal/claimalloc"
)

const driver = "gpu.example.com"

func slice(node string, devices ...string) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-slice"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To(node),
			Pool: resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
		},
	}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d})
	}
	return s
}

func claim(name string, count int64, firstAvailable ...int64) *resourcev1.ResourceClaim {
	req := resourcev1.DeviceRequest{Name: "gpu"}
	if len(firstAvailable) == 0 {
		req.Exactly = &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}
	}
	for i, n := range firstAvailable {
		req.FirstAvailable = append(req.FirstAvailable, resourcev1.DeviceSubRequest{
			Name: []string{"big", "small"}[i], DeviceClassName: "gpu", AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: n,
		})
	}
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec:       resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{req}}},
	}
}

func pod(name string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("pod-" + name)}}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	return p
}

func get(t *testing.T, client *fake.Clientset, name string) *resourcev1.ResourceClaim {
	t.Helper()
	c, err := client.ResourceV1().ResourceClaims("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func devices(c *resourcev1.ResourceClaim) []string {
	var out []string
	if c.Status.Allocation == nil {
		return nil
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Request+"="+r.Pool+"/"+r.Device)
	}
	return out
}

// TestAllocateReserveRelease: the scheduler's allocator gives a claim
// devices of this node's pool (a prioritized list takes the first
// subrequest that fits), the claim is reserved for the pod and protected
// by the scheduler's finalizer; a claim no device set satisfies is refused
// with the allocator's reasons and nothing changes; Release deallocates a
// claim reserved for no pod any more.
func TestAllocateReserveRelease(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(
		&resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}},
		slice("node-1", "gpu-0", "gpu-1", "gpu-2"),
		slice("node-2", "gpu-9"),
		claim("one", 1), claim("prio", 0, 5, 1), claim("two", 2),
	)
	one := pod("one", "one")
	if err := claimalloc.Allocate(ctx, client, "node-1", one); err != nil {
		t.Fatal(err)
	}
	c := get(t, client, "one")
	if got := devices(c); !slices.Equal(got, []string{"gpu=node-1/gpu-0"}) {
		t.Fatalf("claim one allocated %v, want gpu-0 of node-1", got)
	}
	if len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != one.UID || !slices.Contains(c.Finalizers, claimalloc.Finalizer) {
		t.Fatalf("claim one reservedFor %v, finalizers %v: want reserved for pod one, with %s", c.Status.ReservedFor, c.Finalizers, claimalloc.Finalizer)
	}

	if err := claimalloc.Allocate(ctx, client, "node-1", pod("prio", "prio")); err != nil {
		t.Fatal(err)
	}
	if got := devices(get(t, client, "prio")); !slices.Equal(got, []string{"gpu/small=node-1/gpu-1"}) {
		t.Fatalf("claim prio allocated %v, want subrequest small (big wants 5) with gpu-1", got)
	}

	err := claimalloc.Allocate(ctx, client, "node-1", pod("two", "two"))
	if !errors.Is(err, claimalloc.ErrUnsatisfiable) || !strings.Contains(err.Error(), "ResourceClaim default/two") ||
		!strings.Contains(err.Error(), "allocated to another claim") || !strings.Contains(err.Error(), "gpu-0") {
		t.Fatalf("claim two (2 devices, 1 free): %v, want unsatisfiable naming the claim and the devices in use", err)
	}
	if c := get(t, client, "two"); c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 || len(c.Finalizers) != 0 {
		t.Fatalf("a refused claim was changed: %+v", c.Status)
	}

	if err := claimalloc.Release(ctx, client, one); err != nil {
		t.Fatal(err)
	}
	if c := get(t, client, "one"); c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 || slices.Contains(c.Finalizers, claimalloc.Finalizer) {
		t.Fatalf("claim one after Release: %+v, finalizers %v; want deallocated, unreserved, no finalizer", c.Status, c.Finalizers)
	}
	if err := claimalloc.Allocate(ctx, client, "node-1", pod("two", "two")); err != nil {
		t.Fatalf("claim two once gpu-0 is free: %v", err)
	}
}

// TestAllocateTemplateRefused: a claim from a template needs the
// controller that creates it; the error says so and what to do.
func TestAllocateTemplateRefused(t *testing.T) {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p"},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("t")}}}}
	err := claimalloc.Allocate(context.Background(), fake.NewClientset(), "node-1", p)
	if err == nil || !strings.Contains(err.Error(), "spec.resourceClaims[0] (gpu)") || !strings.Contains(err.Error(), "resourceClaimName") {
		t.Fatalf("a template claim: %v, want refused naming the field and the fix", err)
	}
}
