package usb

import (
	"path/filepath"
	"slices"
	"testing"
)

func TestScanLaptop(t *testing.T) {
	t.Parallel()
	devs, err := Scan(filepath.Join("../testdata/hosts/laptop/sys"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	if want := []string{"1-2", "1-3", "3-1", "usb1", "usb3"}; !slices.Equal(names, want) {
		t.Fatalf("devices %v, want %v (interfaces such as 1-2:1.0 are not devices)", names, want)
	}
	tests := []struct {
		name, vendor, product, serial, node string
		ttys                                []string
	}{
		{"1-2", "0403", "6001", "A50285BI", "/dev/bus/usb/001/004", []string{"/dev/ttyUSB0"}},
		{"1-3", "1a86", "7523", "", "/dev/bus/usb/001/005", []string{"/dev/ttyUSB1"}},
		{"3-1", "2341", "0043", "95530343834351A0B1C1", "/dev/bus/usb/003/002", []string{"/dev/ttyACM0"}},
		{"usb1", "1d6b", "0002", "0000:00:14.0", "/dev/bus/usb/001/001", nil},
	}
	for _, tt := range tests {
		i := slices.Index(names, tt.name)
		d := devs[i]
		if d.Vendor != tt.vendor || d.Product != tt.product || d.Serial != tt.serial || d.Node() != tt.node || !slices.Equal(d.TTYs, tt.ttys) || d.NUMANode != -1 {
			t.Errorf("%s = %+v, node %s", tt.name, d, d.Node())
		}
	}
}

func TestScanNoUSB(t *testing.T) {
	t.Parallel()
	devs, err := Scan(t.TempDir())
	if err != nil || len(devs) != 0 {
		t.Fatalf("Scan(empty) = %v, %v", devs, err)
	}
}
