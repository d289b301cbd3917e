package exporter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dpkit/dpkit/pkg/discovery/amd"
)

// AMDCollector reads the use of AMD GPUs from the amdgpu driver's sysfs
// files, without ROCm: utilization_ratio (gpu_busy_percent), memory_used_bytes
// and memory_total_bytes (VRAM), power_watts and temperature_celsius
// (hwmon). It knows the devices of the KFD topology under its sysfs root
// by the IDs dpkit's amdgpu plugin gives them (the PCI address, with -p<n>
// for a compute partition, which reports its GPU's values) and by the
// DRA device names dpkit derives from those.
type AMDCollector struct {
	// SysfsRoot is the host's /sys.
	SysfsRoot string
}

// Name implements DeviceCollector.
func (AMDCollector) Name() string { return "amd" }

// Collect implements DeviceCollector.
func (c AMDCollector) Collect(_ context.Context, devices []Device) ([]Reading, error) {
	gpus, err := amd.Scan(c.SysfsRoot)
	if err != nil {
		return nil, fmt.Errorf("amd: %w", err)
	}
	dirs := map[string]string{} // bus ID -> PCI dir
	for _, g := range gpus {
		if g.BusID != "" && g.PCIDir != "" {
			dirs[g.BusID] = g.PCIDir
		}
	}
	if len(dirs) == 0 {
		return nil, nil
	}
	usage := map[string]amd.Usage{}
	var errs []error
	var out []Reading
	for _, d := range devices {
		bus := amdBus(d, dirs)
		if bus == "" {
			continue
		}
		u, ok := usage[bus]
		if !ok {
			var err error
			u, err = amd.ReadUsage(dirs[bus])
			if err != nil {
				errs = append(errs, err)
			}
			usage[bus] = u
		}
		add := func(name, help string, v *float64, scale float64) {
			if v != nil {
				out = append(out, Reading{Device: d, Name: name, Help: help, Value: *v * scale})
			}
		}
		add("utilization_ratio", "Share of time the device was busy, its utilization (0 to 1).", u.BusyPercent, 0.01)
		add("memory_used_bytes", "Device memory in use.", u.VRAMUsedBytes, 1)
		add("memory_total_bytes", "Device memory.", u.VRAMTotalBytes, 1)
		add("power_watts", "Power the device draws.", u.PowerWatts, 1)
		add("temperature_celsius", "Temperature of the device.", u.TemperatureCelsius, 1)
	}
	return out, errors.Join(errs...)
}

// amdBus returns the bus ID of the GPU d is, or "".
func amdBus(d Device, dirs map[string]string) string {
	if d.DRA() {
		for bus := range dirs {
			if strings.HasPrefix(d.Name, strings.NewReplacer(":", "-", ".", "-").Replace(bus)+"-") {
				return bus
			}
		}
		return ""
	}
	if _, ok := dirs[d.ID]; ok {
		return d.ID
	}
	if i := strings.LastIndex(d.ID, "-p"); i > 0 {
		if _, ok := dirs[d.ID[:i]]; ok {
			return d.ID[:i]
		}
	}
	return ""
}
