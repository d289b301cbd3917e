package draplugin_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/dpkit/dpkit/pkg/draplugin"
)

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
	if got, err := draplugin.PCIeRoot(sys, "0000:3b:00.0"); err != nil || got != "pci0000:3a" {
		t.Fatalf("PCIeRoot = %q, %v; want pci0000:3a", got, err)
	}
	if _, err := draplugin.PCIeRoot(sys, "3b:00.0"); err == nil {
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

// TestResources: devices are split at 128 per slice, 64 where a device
// has a taint, in order; an empty pool is one empty slice.
func TestResources(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n       int
		tainted bool
		sizes   []int
	}{
		{300, false, []int{128, 128, 44}},
		{130, true, []int{64, 64, 2}},
		{10, false, []int{10}},
		{0, false, []int{0}},
	} {
		r := draplugin.Resources("pool", devices(tc.n, tc.tainted), nil)
		got := r.Pools["pool"].Slices
		if len(r.Pools) != 1 || len(got) != len(tc.sizes) {
			t.Fatalf("%d devices (tainted %v): %d pools, %d slices, want 1 pool of %d slices", tc.n, tc.tainted, len(r.Pools), len(got), len(tc.sizes))
		}
		next := 0
		for i, size := range tc.sizes {
			if len(got[i].Devices) != size || (size > 0 && got[i].Devices[0].Name != fmt.Sprintf("dev-%03d", next)) {
				t.Fatalf("%d devices (tainted %v): slice %d has %d devices from %v, want %d from dev-%03d", tc.n, tc.tainted, i, len(got[i].Devices), got[i].Devices, size, next)
			}
			next += size
		}
	}
}
