package amd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestScanMI250(t *testing.T) {
	t.Parallel()
	gpus, err := Scan("../testdata/hosts/mi250/sys")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		node        int
		bus, render string
		card        string
		numa        int
	}{
		{2, "0000:29:00.0", "/dev/dri/renderD128", "/dev/dri/card1", 0},
		{3, "0000:2c:00.0", "/dev/dri/renderD129", "/dev/dri/card2", 0},
		{4, "0000:a9:00.0", "/dev/dri/renderD130", "/dev/dri/card3", 1},
		{5, "0000:ac:00.0", "/dev/dri/renderD131", "/dev/dri/card4", 1},
	}
	if len(gpus) != len(want) {
		t.Fatalf("got %d GPUs, want %d (CPU nodes 0 and 1 have simd_count 0): %+v", len(gpus), len(want), gpus)
	}
	for i, w := range want {
		g := gpus[i]
		if g.Node != w.node || g.BusID != w.bus || g.RenderNode != w.render || g.CardNode != w.card || g.NUMANode != w.numa ||
			g.DeviceID != "740c" || g.VendorID != "1002" || g.ProductName != "AMD Instinct MI250X/MI250" {
			t.Errorf("GPU %d = %+v, want %+v", i, g, w)
		}
	}
}

// TestScanMI300XCPX reads 8 MI300X in the CPX mode: each PCI device has
// eight KFD nodes of one XCC, each with its own render node.
func TestScanMI300XCPX(t *testing.T) {
	t.Parallel()
	gpus, err := Scan("../testdata/hosts/mi300x/sys")
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 64 {
		t.Fatalf("got %d GPUs, want 64 partitions", len(gpus))
	}
	perBus := map[string]int{}
	renders := map[string]bool{}
	for _, g := range gpus {
		perBus[g.BusID]++
		renders[g.RenderNode] = true
		if g.XCCs != 1 || g.ComputePartition != "CPX" || g.MemoryPartition != "NPS4" || g.DeviceID != "74a1" || g.ProductName != "AMD Instinct MI300X" {
			t.Errorf("partition at KFD node %d = %+v", g.Node, g)
		}
	}
	if len(perBus) != 8 || perBus["0000:05:00.0"] != 8 || len(renders) != 64 {
		t.Errorf("partitions per GPU %v and %d render nodes, want 8 GPUs of 8 and 64", perBus, len(renders))
	}
	if g := gpus[7]; g.BusID != "0000:05:00.0" || g.RenderNode != "/dev/dri/renderD142" || g.NUMANode != 0 {
		t.Errorf("GPU 0's last partition = %+v, want renderD142 on 0000:05:00.0", g)
	}
	if mi250, _ := Scan("../testdata/hosts/mi250/sys"); mi250[0].XCCs != 1 {
		t.Errorf("an MI250 GCD has %d XCCs, want 1", mi250[0].XCCs)
	}
}

func TestScanWithoutKFD(t *testing.T) {
	t.Parallel()
	gpus, err := Scan("../testdata/hosts/laptop/sys")
	if err != nil || len(gpus) != 0 {
		t.Fatalf("Scan = %v, %v; want none", gpus, err)
	}
}

// TestScanFallbacks covers a node without location_id (found through
// /sys/class/drm) and a render minor missing from properties (taken from the
// PCI device's drm directory).
func TestScanFallbacks(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("class/kfd/kfd/topology/nodes/1/properties", "simd_count 304\nvendor_id 4098\ndevice_id 29857\ndrm_render_minor 130\n")
	write("devices/pci0000:00/0000:05:00.0/vendor", "0x1002\n")
	write("devices/pci0000:00/0000:05:00.0/numa_node", "3\n")
	write("devices/pci0000:00/0000:05:00.0/current_compute_partition", "CPX\n")
	if err := os.MkdirAll(filepath.Join(root, "class/drm/renderD130"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:00/0000:05:00.0", filepath.Join(root, "class/drm/renderD130/device")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "bus/pci/devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:00/0000:05:00.0", filepath.Join(root, "bus/pci/devices/0000:05:00.0")); err != nil {
		t.Fatal(err)
	}
	gpus, err := Scan(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 1 {
		t.Fatalf("got %+v", gpus)
	}
	g := gpus[0]
	if g.BusID != "0000:05:00.0" || g.NUMANode != 3 || g.ComputePartition != "CPX" || g.RenderNode != "/dev/dri/renderD130" || g.CardNode != "" {
		t.Errorf("GPU = %+v", g)
	}
}

func TestParseProperties(t *testing.T) {
	t.Parallel()
	p, err := ParseProperties(strings.NewReader("simd_count 416\n\nunique_id 18446744073709551615\nlocation_id 10496\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p["simd_count"] != 416 || p["location_id"] != 10496 || p["unique_id"] != -1 {
		t.Errorf("got %v", p)
	}
	for _, bad := range []string{"simd_count\n", "simd_count x\n", "a 1 2\n"} {
		if _, err := ParseProperties(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseProperties(%q) = nil error", bad)
		}
	}
}

func FuzzParseProperties(f *testing.F) {
	f.Add("simd_count 416\nlocation_id 10496\n")
	f.Add("cpu_cores_count 64\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseProperties(strings.NewReader(s))
		if err == nil && p == nil {
			t.Error("nil map without error")
		}
	})
}
