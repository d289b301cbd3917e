// Package pci reads PCI functions from sysfs (/sys/bus/pci/devices).
//
// Entries of /sys/bus/pci/devices are symlinks into /sys/devices/pci*/...
// on real hosts; plain directories (some fixture trees) work the same.
// Missing optional files leave their fields empty.
package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
)

// DevicesDir is where PCI functions are listed, relative to the sysfs root.
const DevicesDir = "bus/pci/devices"

// Device is one PCI function.
type Device struct {
	// Address is the normalized bus address, such as 0000:3b:00.0.
	Address string
	// Vendor, Device, Class, SubsystemVendor and SubsystemDevice are
	// lower-case hex without 0x: "10de", "20b0", "030200".
	Vendor, Device, Class            string
	SubsystemVendor, SubsystemDevice string
	// NUMANode is the function's NUMA node or numa.None.
	NUMANode int
	// IOMMUGroup is the IOMMU group number, "" when the host has no
	// IOMMU enabled.
	IOMMUGroup string
	// Driver is the bound driver's name ("vfio-pci", "nvidia", "amdgpu"),
	// "" when unbound.
	Driver string
	// Dir is the local sysfs directory of the function.
	Dir string
}

// VFIONode returns the VFIO group node a container needs for the function,
// /dev/vfio/<group>, or "" when it has no IOMMU group.
func (d Device) VFIONode() string {
	if d.IOMMUGroup == "" {
		return ""
	}
	return devfs.Host("vfio/" + d.IOMMUGroup)
}

// DRMNodes returns the host paths of the function's DRM nodes
// (/dev/dri/card1, /dev/dri/renderD128), naturally sorted.
func (d Device) DRMNodes() (cards, renders []string) {
	entries, err := os.ReadDir(filepath.Join(d.Dir, "drm"))
	if err != nil {
		return nil, nil
	}
	for _, e := range entries {
		switch name := e.Name(); {
		case strings.HasPrefix(name, "renderD"):
			renders = append(renders, devfs.Host("dri/"+name))
		case strings.HasPrefix(name, "card") && !strings.Contains(name, "-"):
			// card1-DP-1 and the like are connectors, not nodes.
			cards = append(cards, devfs.Host("dri/"+name))
		}
	}
	devfs.SortNatural(cards)
	devfs.SortNatural(renders)
	return cards, renders
}

// Scan returns every PCI function below sysfsRoot, in address order. A
// host without PCI (no bus/pci/devices) has none.
func Scan(sysfsRoot string) ([]Device, error) {
	entries, err := os.ReadDir(filepath.Join(sysfsRoot, DevicesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list PCI devices: %w", err)
	}
	devs := make([]Device, 0, len(entries))
	var errs []error
	for _, e := range entries {
		d, err := Read(sysfsRoot, e.Name())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		devs = append(devs, d)
	}
	if len(devs) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return devs, nil
}

// Read reads one PCI function by address (any case, short or long
// domain).
func Read(sysfsRoot, address string) (Device, error) {
	addr, err := NormalizeAddress(address)
	if err != nil {
		return Device{}, err
	}
	dir := filepath.Join(sysfsRoot, DevicesDir, addr)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return Device{}, fmt.Errorf("PCI device %s: %w", addr, err)
	}
	if !fi.IsDir() {
		return Device{}, fmt.Errorf("PCI device %s: %s is not a directory", addr, dir)
	}
	d := Device{
		Address:         addr,
		Dir:             dir,
		Vendor:          readHex(dir, "vendor"),
		Device:          readHex(dir, "device"),
		Class:           readHex(dir, "class"),
		SubsystemVendor: readHex(dir, "subsystem_vendor"),
		SubsystemDevice: readHex(dir, "subsystem_device"),
		NUMANode:        numa.ReadNode(dir),
		IOMMUGroup:      linkBase(dir, "iommu_group"),
		Driver:          linkBase(dir, "driver"),
	}
	if d.Vendor == "" {
		return Device{}, fmt.Errorf("PCI device %s: no vendor file in %s", addr, dir)
	}
	return d, nil
}

// NormalizeAddress returns a PCI address the way sysfs names it:
// lower-case, a domain of at least four hex digits ("00000000:3B:00.0" and
// "3b:00.0" both give "0000:3b:00.0").
func NormalizeAddress(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(s, ":")
	var domain, bus, devfn string
	switch len(parts) {
	case 2:
		domain, bus, devfn = "0", parts[0], parts[1]
	case 3:
		domain, bus, devfn = parts[0], parts[1], parts[2]
	default:
		return "", fmt.Errorf("PCI address %q: want [domain:]bus:device.function", s)
	}
	dev, fn, ok := strings.Cut(devfn, ".")
	dom, err1 := strconv.ParseUint(domain, 16, 32)
	b, err2 := strconv.ParseUint(bus, 16, 8)
	d, err3 := strconv.ParseUint(dev, 16, 8)
	f, err4 := strconv.ParseUint(fn, 16, 8)
	if !ok || err1 != nil || err2 != nil || err3 != nil || err4 != nil || d > 0x1f || f > 7 {
		return "", fmt.Errorf("PCI address %q: want [domain:]bus:device.function in hex", s)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, b, d, f), nil
}

func readHex(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(string(b))), "0x")
}

func linkBase(dir, name string) string {
	target, err := os.Readlink(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}
