// Package nvidia discovers NVIDIA GPUs without cgo or NVML: the driver
// lists every GPU under /proc/driver/nvidia/gpus/<bus-id>/information
// (model, UUID, device minor, bus location); the device nodes are
// /dev/nvidia<minor> plus the shared /dev/nvidiactl and /dev/nvidia-uvm*;
// the NUMA node comes from the PCI device in sysfs.
package nvidia

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/discovery/pci"
)

// GPUsDir is the driver's GPU list, relative to the procfs root.
const GPUsDir = "driver/nvidia/gpus"

// Control nodes every container using NVIDIA GPUs needs (the UVM nodes and
// modeset exist only when their modules are loaded).
const (
	ControlNode = "/dev/nvidiactl"
	ModesetNode = "/dev/nvidia-modeset"
)

// UVMNodes returns the unified memory nodes, a new slice on every call.
func UVMNodes() []string { return []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"} }

const minorUnknown = -1

// GPU is one NVIDIA GPU.
type GPU struct {
	// UUID is the GPU's UUID, GPU-xxxxxxxx-xxxx-...
	UUID string
	// Model is the product name, such as "NVIDIA H100 80GB HBM3".
	Model string
	// BusID is the normalized PCI address, such as 0000:1b:00.0.
	BusID string
	// Minor is the device minor (the N of /dev/nvidiaN), -1 when unknown.
	Minor int
	// Excluded is true when the driver reports the GPU as excluded (it
	// cannot be used).
	Excluded bool
	// NUMANode is the PCI device's NUMA node or numa.None.
	NUMANode int
}

// Node returns the GPU's device node, /dev/nvidia<minor>, or "" when the
// minor is unknown.
func (g GPU) Node() string {
	if g.Minor < 0 {
		return ""
	}
	return devfs.Host("nvidia" + strconv.Itoa(g.Minor))
}

// Scan returns the GPUs the driver lists, in bus order. A host without the
// driver has none. GPUs whose information file cannot be parsed are
// skipped; their errors are returned only when no GPU could be read.
func Scan(procRoot, sysfsRoot string) ([]GPU, error) {
	dir := filepath.Join(procRoot, GPUsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list NVIDIA GPUs: %w", err)
	}
	var gpus []GPU
	var errs []error
	for _, e := range entries {
		f, err := os.Open(filepath.Join(dir, e.Name(), "information"))
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", e.Name(), err))
			continue
		}
		info, err := ParseInformation(f)
		_ = f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", e.Name(), err))
			continue
		}
		g, err := info.gpu(e.Name())
		if err != nil {
			errs = append(errs, fmt.Errorf("GPU %s: %w", e.Name(), err))
			continue
		}
		g.NUMANode = numa.ReadNode(filepath.Join(sysfsRoot, pci.DevicesDir, g.BusID))
		gpus = append(gpus, g)
	}
	if len(gpus) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return gpus, nil
}

// Information is the parsed information file of one GPU: "Key: value"
// lines (Model, IRQ, GPU UUID, Video BIOS, Bus Type, DMA Size, DMA Mask,
// Bus Location, Device Minor, GPU Excluded).
type Information map[string]string

// ParseInformation parses /proc/driver/nvidia/gpus/<bus-id>/information.
func ParseInformation(r io.Reader) (Information, error) {
	info := make(Information)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		key = strings.TrimSpace(key)
		if key == "" {
			continue
		}
		info[key] = strings.TrimSpace(value)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read information: %w", err)
	}
	return info, nil
}

func (info Information) gpu(dirName string) (GPU, error) {
	g := GPU{
		UUID:     info["GPU UUID"],
		Model:    info["Model"],
		Minor:    minorUnknown,
		NUMANode: numa.None,
		Excluded: strings.EqualFold(info["GPU Excluded"], "yes"),
	}
	if g.UUID == "" {
		return GPU{}, errors.New("information has no GPU UUID")
	}
	loc := info["Bus Location"]
	if loc == "" {
		loc = dirName
	}
	bus, err := pci.NormalizeAddress(loc)
	if err != nil {
		return GPU{}, err
	}
	g.BusID = bus
	if m, err := strconv.Atoi(info["Device Minor"]); err == nil && m >= 0 {
		g.Minor = m
	}
	return g, nil
}

// VersionFile is the driver's version file, relative to the procfs root.
const VersionFile = "driver/nvidia/version"

// DriverVersion returns the kernel driver's version, such as "550.90.07",
// from the first line of /proc/driver/nvidia/version ("NVRM version:
// NVIDIA UNIX ... Kernel Module  550.90.07  Release Build ..."). It
// returns an error when the file is missing or names no version.
func DriverVersion(procRoot string) (string, error) {
	b, err := os.ReadFile(filepath.Join(procRoot, VersionFile))
	if err != nil {
		return "", fmt.Errorf("read the NVIDIA driver version: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	if _, rest, ok := strings.Cut(first, "NVRM version:"); ok {
		for _, f := range strings.Fields(rest) {
			if isDottedNumber(f) {
				return f, nil
			}
		}
	}
	return "", fmt.Errorf("%s names no version: %q", VersionFile, first)
}

// isDottedNumber reports whether s is two or more dot-separated numbers.
func isDottedNumber(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}
