// Package usb reads USB devices from sysfs (/sys/bus/usb/devices) and
// names their device nodes (/dev/bus/usb/BBB/DDD and any serial ttys).
//
// Entries of /sys/bus/usb/devices are symlinks into /sys/devices/...; plain
// directories work the same. Interfaces (names with a colon) are not
// devices; their tty children are reported on the device.
package usb

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

// DevicesDir is where USB devices are listed, relative to the sysfs root.
const DevicesDir = "bus/usb/devices"

// Device is one USB device.
type Device struct {
	// Name is the sysfs name, the device's port path, such as 1-2.3 (or
	// usb1 for a root hub). It is stable while the device stays in its
	// port.
	Name string
	// Vendor and Product are lower-case hex IDs such as "0403", "6001".
	Vendor, Product string
	// Serial, Manufacturer and ProductName are the device's strings, ""
	// when it has none.
	Serial, Manufacturer, ProductName string
	// BusNum and DevNum locate the device's node.
	BusNum, DevNum int
	// TTYs are host paths of serial ports the device provides
	// (/dev/ttyUSB0, /dev/ttyACM0).
	TTYs []string
	// NUMANode is the host controller's NUMA node or numa.None.
	NUMANode int
	// Dir is the local sysfs directory of the device.
	Dir string
}

// Node returns the device's usbfs node, /dev/bus/usb/BBB/DDD.
func (d Device) Node() string {
	return devfs.Host(fmt.Sprintf("bus/usb/%03d/%03d", d.BusNum, d.DevNum))
}

// Scan returns every USB device below sysfsRoot, naturally sorted by name.
func Scan(sysfsRoot string) ([]Device, error) {
	entries, err := os.ReadDir(filepath.Join(sysfsRoot, DevicesDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list USB devices: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		if !strings.Contains(e.Name(), ":") {
			names = append(names, e.Name())
		}
	}
	devfs.SortNatural(names)
	devs := make([]Device, 0, len(names))
	for _, name := range names {
		d, ok := read(sysfsRoot, name)
		if ok {
			devs = append(devs, d)
		}
	}
	return devs, nil
}

func read(sysfsRoot, name string) (Device, bool) {
	dir := filepath.Join(sysfsRoot, DevicesDir, name)
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	d := Device{
		Name:         name,
		Dir:          dir,
		Vendor:       strings.ToLower(readString(dir, "idVendor")),
		Product:      strings.ToLower(readString(dir, "idProduct")),
		Serial:       readString(dir, "serial"),
		Manufacturer: readString(dir, "manufacturer"),
		ProductName:  readString(dir, "product"),
	}
	var err1, err2 error
	d.BusNum, err1 = strconv.Atoi(readString(dir, "busnum"))
	d.DevNum, err2 = strconv.Atoi(readString(dir, "devnum"))
	if d.Vendor == "" || err1 != nil || err2 != nil {
		return Device{}, false
	}
	d.TTYs = ttys(dir, name)
	root, err := filepath.EvalSymlinks(sysfsRoot)
	if err != nil {
		root = sysfsRoot
	}
	d.NUMANode = numa.NodeOfSysPath(dir, root)
	return d, true
}

// ttys finds serial ports below the device's interfaces: usb-serial
// drivers create <if>/ttyUSB0, cdc-acm creates <if>/tty/ttyACM0.
func ttys(dir, name string) []string {
	var out []string
	ifaces, _ := filepath.Glob(filepath.Join(dir, name+":*"))
	for _, iface := range ifaces {
		for _, pattern := range []string{"tty[A-Z]*", "tty/tty[A-Z]*"} {
			m, _ := filepath.Glob(filepath.Join(iface, pattern))
			for _, p := range m {
				out = append(out, devfs.Host(filepath.Base(p)))
			}
		}
	}
	devfs.SortNatural(out)
	return out
}

func readString(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
