package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dpkit/dpkit/pkg/dra"
)

func TestDeviceName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 70)
	for _, tc := range []struct{ id, want string }{
		{"gpu-0", "gpu-0"},
		{"GPU-0", "gpu-0-"},
		{"0000:3b:00.0", "0000-3b-00-0-"},
		{"--", "d-"},
		{long, strings.Repeat("a", 52) + "-"},
	} {
		got := dra.DeviceName(tc.id)
		if !strings.HasPrefix(got, tc.want) || len(got) > 63 || (strings.HasSuffix(tc.want, "-") && len(got) != len(tc.want)+10) {
			t.Errorf("DeviceName(%q) = %q, want %q plus a hash where it ends in '-'", tc.id, got, tc.want)
		}
		if got != dra.DeviceName(tc.id) {
			t.Errorf("DeviceName(%q) is not stable", tc.id)
		}
	}
	if a, b := dra.DeviceName("GPU-0"), dra.DeviceName("gpu_0"); a == b || a == "gpu-0" || b == "gpu-0" {
		t.Errorf("IDs that clean up alike collide: %q %q", a, b)
	}
}

func TestPCIeRoot(t *testing.T) {
	t.Parallel()
	sys := t.TempDir()
	dev := filepath.Join(sys, "devices", "pci0000:3a", "0000:3a:00.0", "0000:3b:00.0")
	if err := os.MkdirAll(dev, 0o750); err != nil {
		t.Fatal(err)
	}
	links := filepath.Join(sys, "bus", "pci", "devices")
	if err := os.MkdirAll(links, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0", filepath.Join(links, "0000:3b:00.0")); err != nil {
		t.Fatal(err)
	}
	if got, err := dra.PCIeRoot(sys, "0000:3b:00.0"); err != nil || got != "pci0000:3a" {
		t.Fatalf("PCIeRoot = %q, %v; want pci0000:3a", got, err)
	}
	if _, err := dra.PCIeRoot(sys, "3b:00.0"); err == nil {
		t.Fatal("a bus ID without domain was accepted")
	}
}

func devices(n int, tainted bool) []resourcev1.Device {
	out := make([]resourcev1.Device, n)
	for i := range out {
		out[i] = resourcev1.Device{Name: fmt.Sprintf("dev-%03d", i)}
		if tainted && i == n-1 {
			out[i].Taints = []resourcev1.DeviceTaint{{Key: "x.example.com/unhealthy", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
		}
	}
	return out
}

// TestAPISlices: devices are split at 128 per slice (64 with a taint),
// the slices are owned by the Node, named deterministically and carry the
// pool's generation and slice count; an unchanged publish writes nothing,
// a changed one bumps the generation and deletes slices no longer needed.
func TestAPISlices(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "node-uid"}})
	pub := dra.APISlices(client, "gpu.example.com", "node-1")
	list := func() map[string]resourcev1.ResourceSlice {
		l, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]resourcev1.ResourceSlice{}
		for _, s := range l.Items {
			out[s.Name] = s
		}
		return out
	}
	check := func(step string, sizes []int, gen int64) {
		t.Helper()
		got := list()
		if len(got) != len(sizes) {
			t.Fatalf("%s: %d slices, want %d", step, len(got), len(sizes))
		}
		for i, size := range sizes {
			s, ok := got[dra.SliceName("node-1", "gpu.example.com", i)]
			if !ok {
				t.Fatalf("%s: no slice %d", step, i)
			}
			if len(s.Spec.Devices) != size || s.Spec.Pool.Generation != gen || s.Spec.Pool.ResourceSliceCount != int64(len(sizes)) ||
				s.Spec.Pool.Name != "pool" || *s.Spec.NodeName != "node-1" || s.Spec.Driver != "gpu.example.com" ||
				len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "node-uid" || s.OwnerReferences[0].Kind != "Node" {
				t.Fatalf("%s: slice %d = %+v %+v, want %d devices, generation %d", step, i, s.ObjectMeta, s.Spec.Pool, size, gen)
			}
		}
	}
	if err := pub.Publish(ctx, "pool", devices(300, false)); err != nil {
		t.Fatal(err)
	}
	check("300 devices", []int{128, 128, 44}, 1)
	writes := len(client.Actions())
	if err := pub.Publish(ctx, "pool", devices(300, false)); err != nil {
		t.Fatal(err)
	}
	for _, a := range client.Actions()[writes:] {
		if a.GetVerb() != "list" && a.GetVerb() != "get" {
			t.Fatalf("unchanged publish wrote: %v", a)
		}
	}
	if err := pub.Publish(ctx, "pool", devices(130, true)); err != nil {
		t.Fatal(err)
	}
	check("130 devices, one tainted", []int{64, 64, 2}, 2)
	if err := pub.Publish(ctx, "pool", devices(10, false)); err != nil {
		t.Fatal(err)
	}
	check("10 devices", []int{10}, 3)
	if err := pub.Publish(ctx, "pool", nil); err != nil {
		t.Fatal(err)
	}
	check("no devices", []int{0}, 4)
}
