package amd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Usage is what the amdgpu driver says in sysfs about a GPU's use. A
// field the driver does not expose is nil.
type Usage struct {
	// BusyPercent is gpu_busy_percent: the share of time the GPU was
	// busy, 0 to 100.
	BusyPercent *float64
	// VRAMUsedBytes and VRAMTotalBytes are mem_info_vram_used and
	// mem_info_vram_total.
	VRAMUsedBytes, VRAMTotalBytes *float64
	// PowerWatts is the hwmon power1_average (else power1_input), read in
	// microwatts.
	PowerWatts *float64
	// TemperatureCelsius is the hwmon temp1_input (the edge sensor), read
	// in millidegrees.
	TemperatureCelsius *float64
}

// ReadUsage reads the use of the GPU whose PCI function's sysfs
// directory is pciDir (GPU.PCIDir). A file that is absent is left out; a
// file that is there but not a number is an error naming it.
func ReadUsage(pciDir string) (Usage, error) {
	var u Usage
	var errs []error
	read := func(name string, scale float64) *float64 {
		b, err := os.ReadFile(filepath.Join(pciDir, name))
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", filepath.Join(pciDir, name), err))
			return nil
		}
		v *= scale
		return &v
	}
	u.BusyPercent = read("gpu_busy_percent", 1)
	u.VRAMUsedBytes = read("mem_info_vram_used", 1)
	u.VRAMTotalBytes = read("mem_info_vram_total", 1)
	hw, _ := filepath.Glob(filepath.Join(pciDir, "hwmon", "hwmon*"))
	slices.Sort(hw)
	if len(hw) > 0 {
		rel, _ := filepath.Rel(pciDir, hw[0])
		if u.PowerWatts = read(filepath.Join(rel, "power1_average"), 1e-6); u.PowerWatts == nil {
			u.PowerWatts = read(filepath.Join(rel, "power1_input"), 1e-6)
		}
		u.TemperatureCelsius = read(filepath.Join(rel, "temp1_input"), 1e-3)
	}
	return u, errors.Join(errs...)
}
