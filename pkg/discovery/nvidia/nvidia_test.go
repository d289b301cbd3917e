package nvidia

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestScanDGX(t *testing.T) {
	t.Parallel()
	host := "../testdata/hosts/dgx-h100"
	gpus, err := Scan(filepath.Join(host, "proc"), filepath.Join(host, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("got %d GPUs, want 8", len(gpus))
	}
	for i, g := range gpus {
		wantNUMA := i / 4
		if g.Minor != i || g.Node() != fmt.Sprintf("/dev/nvidia%d", i) || g.NUMANode != wantNUMA ||
			g.Model != "NVIDIA H100 80GB HBM3" || !strings.HasPrefix(g.UUID, "GPU-") || g.Excluded {
			t.Errorf("GPU %d = %+v", i, g)
		}
	}
	if gpus[0].BusID != "0000:18:00.0" {
		t.Errorf("bus of GPU 0 = %s", gpus[0].BusID)
	}
}

func TestScanUpperCaseLongDomain(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "proc", GPUsDir, "0000:3b:00.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	info := "Model: \t\t Tesla V100-SXM2-16GB\nGPU UUID: \t GPU-aaaa\nBus Location: \t 00000000:3B:00.0\nDevice Minor: \t ?\nGPU Excluded:\t Yes\n"
	if err := os.WriteFile(filepath.Join(dir, "information"), []byte(info), 0o644); err != nil {
		t.Fatal(err)
	}
	pdir := filepath.Join(root, "sys/bus/pci/devices/0000:3b:00.0")
	if err := os.MkdirAll(pdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(root, "proc", GPUsDir, "0000:5e:00.0")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	gpus, err := Scan(filepath.Join(root, "proc"), filepath.Join(root, "sys"))
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 1 {
		t.Fatalf("got %+v; a GPU without information is skipped", gpus)
	}
	g := gpus[0]
	if g.BusID != "0000:3b:00.0" || g.Minor != -1 || g.Node() != "" || !g.Excluded || g.NUMANode != 1 {
		t.Errorf("GPU = %+v", g)
	}
}

func TestScanNoDriver(t *testing.T) {
	t.Parallel()
	gpus, err := Scan(t.TempDir(), t.TempDir())
	if err != nil || gpus != nil {
		t.Fatalf("Scan = %v, %v", gpus, err)
	}
}

func FuzzParseInformation(f *testing.F) {
	f.Add("Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-1\nBus Location: \t 0000:18:00.0\nDevice Minor: \t 0\n")
	f.Add(":::\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		info, err := ParseInformation(strings.NewReader(s))
		if err != nil {
			return
		}
		g, err := info.gpu("0000:18:00.0")
		if err == nil && (g.UUID == "" || g.BusID == "") {
			t.Errorf("GPU without UUID or bus accepted: %+v", g)
		}
	})
}

func TestDriverVersion(t *testing.T) {
	t.Parallel()
	v, err := DriverVersion("../testdata/hosts/dgx-h100/proc")
	if err != nil || v != "550.90.07" {
		t.Fatalf("DriverVersion(dgx-h100) = %q, %v; want 550.90.07", v, err)
	}
	root := t.TempDir()
	if _, err := DriverVersion(root); err == nil {
		t.Error("DriverVersion without the file: no error")
	}
	if err := os.MkdirAll(filepath.Join(root, "driver/nvidia"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, VersionFile), []byte("NVRM version: something else\nGCC version: 12.3.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := DriverVersion(root); err == nil {
		t.Errorf("DriverVersion of a line without a version = %q, want an error", v)
	}
}

// TestMIGLayouts: the profiles of the H100 80GB and the A100 40GB, as
// NVIDIA's MIG user guide lists them, and every profile's instances fit
// the GPU's slices at once.
func TestMIGLayouts(t *testing.T) {
	for model, want := range map[string]string{
		"NVIDIA H100 80GB HBM3": "1g.10gb×7 1g.20gb×4 2g.20gb×3 3g.40gb×2 4g.40gb×1 7g.80gb×1",
		"NVIDIA A100-SXM4-40GB": "1g.5gb×7 1g.10gb×4 2g.10gb×3 3g.20gb×2 4g.20gb×1 7g.40gb×1",
		"NVIDIA A100 80GB PCIe": "1g.10gb×7 1g.20gb×4 2g.20gb×3 3g.40gb×2 4g.40gb×1 7g.80gb×1",
		// As nvidia-smi mig -lgip listed them on an H200 (docs/plugins/nvidia.md).
		"NVIDIA H200": "1g.18gb×7 1g.35gb×4 2g.35gb×3 3g.71gb×2 4g.71gb×1 7g.141gb×1",
	} {
		l, ok := MIGLayoutOf(model)
		if !ok {
			t.Fatalf("%s: no MIG layout", model)
		}
		var got []string
		for _, p := range l.Profiles {
			got = append(got, fmt.Sprintf("%s×%d", p.Name, p.Instances))
			if p.Instances*p.ComputeSlices > l.ComputeSlices || p.Instances*p.MemorySlices > l.MemorySlices {
				t.Errorf("%s %s: %d instances do not fit %d compute and %d memory slices", model, p.Name, p.Instances, l.ComputeSlices, l.MemorySlices)
			}
		}
		if strings.Join(got, " ") != want {
			t.Errorf("%s: %s, want %s", model, strings.Join(got, " "), want)
		}
	}
	if _, ok := MIGLayoutOf("NVIDIA GeForce RTX 4090"); ok {
		t.Error("a GPU without MIG has a layout")
	}
}

func TestMemoryOf(t *testing.T) {
	for model, want := range map[string]int64{
		"NVIDIA H100 80GB HBM3":   80 << 30,
		"NVIDIA A100-SXM4-40GB":   40 << 30,
		"NVIDIA A100 80GB PCIe":   80 << 30,
		"NVIDIA H200":             143771 << 20,
		"Tesla V100-PCIE-16GB":    16 << 30,
		"NVIDIA H100 NVL":         0,
		"NVIDIA L40S":             0,
		"NVIDIA GeForce RTX 4090": 0,
		"NVIDIA RTX A6000 48GBX":  0,
		"":                        0,
	} {
		got, ok := MemoryOf(model)
		if got != want || ok != (want > 0) {
			t.Errorf("MemoryOf(%q) = %d, %v; want %d", model, got, ok, want)
		}
	}
}
