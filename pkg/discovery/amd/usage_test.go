package amd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadUsage reads the mi250 fixture: the GCD at KFD node n is n*10 %
// busy, uses n GiB of VRAM, draws 100+n W at 40+n degrees C.
func TestReadUsage(t *testing.T) {
	t.Parallel()
	gpus, err := Scan("../testdata/hosts/mi250/sys")
	if err != nil || len(gpus) != 4 {
		t.Fatalf("Scan: %d GPUs, %v", len(gpus), err)
	}
	for _, g := range gpus {
		u, err := ReadUsage(g.PCIDir)
		if err != nil {
			t.Fatalf("%s: %v", g.BusID, err)
		}
		n := float64(g.Node)
		for name, tc := range map[string]struct {
			got  *float64
			want float64
		}{
			"busy":  {u.BusyPercent, n * 10},
			"used":  {u.VRAMUsedBytes, n * (1 << 30)},
			"total": {u.VRAMTotalBytes, 68702699520},
			"power": {u.PowerWatts, 100 + n},
			"temp":  {u.TemperatureCelsius, 40 + n},
		} {
			if tc.got == nil || *tc.got != tc.want {
				t.Errorf("%s %s = %v, want %v", g.BusID, name, tc.got, tc.want)
			}
		}
	}
}

// TestReadUsageMissingAndBad: absent files are nil, a garbled one is an
// error naming the file.
func TestReadUsageMissingAndBad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	u, err := ReadUsage(dir)
	if err != nil || u.BusyPercent != nil || u.PowerWatts != nil {
		t.Errorf("an empty directory: %+v, %v", u, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gpu_busy_percent"), []byte("busy\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadUsage(dir); err == nil || !strings.Contains(err.Error(), "gpu_busy_percent") {
		t.Errorf("a garbled gpu_busy_percent: %v", err)
	}
}
