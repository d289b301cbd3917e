package pci

import (
	"path/filepath"
	"slices"
	"testing"
)

const hosts = "../testdata/hosts"

func TestScan(t *testing.T) {
	t.Parallel()
	devs, err := Scan(filepath.Join(hosts, "dgx-h100/sys"))
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 16 {
		t.Fatalf("got %d devices, want 8 GPUs and 8 NICs", len(devs))
	}
	byAddr := map[string]Device{}
	for _, d := range devs {
		byAddr[d.Address] = d
	}
	tests := []struct {
		addr, vendor, class, driver, group, vfio string
		numa                                     int
	}{
		{"0000:18:00.0", "10de", "030200", "nvidia", "", "", 0},
		{"0000:db:00.0", "10de", "030200", "nvidia", "", "", 1},
		{"0000:19:00.0", "15b3", "020700", "mlx5_core", "", "", 0},
		{"0000:dc:00.0", "15b3", "020700", "vfio-pci", "41", "/dev/vfio/41", 1},
	}
	for _, tt := range tests {
		d, ok := byAddr[tt.addr]
		if !ok {
			t.Errorf("%s not found", tt.addr)
			continue
		}
		if d.Vendor != tt.vendor || d.Class != tt.class || d.Driver != tt.driver || d.IOMMUGroup != tt.group || d.VFIONode() != tt.vfio || d.NUMANode != tt.numa {
			t.Errorf("%s = %+v", tt.addr, d)
		}
	}
}

func TestScanMissingBus(t *testing.T) {
	t.Parallel()
	devs, err := Scan(t.TempDir())
	if err != nil || len(devs) != 0 {
		t.Fatalf("Scan(empty) = %v, %v; want none", devs, err)
	}
}

func TestDRMNodes(t *testing.T) {
	t.Parallel()
	d, err := Read(filepath.Join(hosts, "laptop/sys"), "0000:00:02.0")
	if err != nil {
		t.Fatal(err)
	}
	cards, renders := d.DRMNodes()
	if !slices.Equal(cards, []string{"/dev/dri/card0"}) || !slices.Equal(renders, []string{"/dev/dri/renderD128"}) {
		t.Errorf("DRMNodes = %v, %v (connectors such as card0-eDP-1 are not nodes)", cards, renders)
	}
	if d.NUMANode != -1 {
		t.Errorf("laptop NUMA node = %d, want -1", d.NUMANode)
	}
}

func TestNormalizeAddress(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"0000:3b:00.0", "0000:3b:00.0"},
		{"00000000:3B:00.0", "0000:3b:00.0"},
		{"3b:1f.7", "0000:3b:1f.7"},
		{"10000:01:00.1", "10000:01:00.1"},
		{" 0001:C1:00.0\n", "0001:c1:00.0"},
		{"3b:00", ""},
		{"0000:3b:20.0", ""},
		{"0000:3b:00.8", ""},
		{"zz:00.0", ""},
		{"", ""},
	}
	for _, tt := range tests {
		got, err := NormalizeAddress(tt.in)
		if got != tt.want || (err != nil) != (tt.want == "") {
			t.Errorf("NormalizeAddress(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzNormalizeAddress(f *testing.F) {
	for _, s := range []string{"0000:3b:00.0", "00000000:3B:00.0", "3b:00.0", "::.", "ffff:ff:1f.7"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := NormalizeAddress(s)
		if err != nil {
			return
		}
		again, err := NormalizeAddress(got)
		if err != nil || again != got {
			t.Errorf("NormalizeAddress(%q) = %q, not a fixed point (%q, %v)", s, got, again, err)
		}
	})
}
