// Package amd discovers AMD GPUs the way the ROCm stack sees them: from
// the KFD topology (/sys/class/kfd/kfd/topology/nodes/*/properties), where
// nodes with simd_count > 0 are GPUs (node 0 and other CPU nodes have
// none). Each GPU's PCI address comes from location_id and domain, its
// render node from drm_render_minor, its card node and NUMA node from the
// PCI device in sysfs.
package amd

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/discovery/pci"
)

// TopologyDir is the KFD topology, relative to the sysfs root.
const TopologyDir = "class/kfd/kfd/topology/nodes"

// KFDNode is the host path of the compute interface every ROCm container
// needs.
const KFDNode = "/dev/kfd"

// GPU is one GPU (or one compute partition of a partitioned GPU) in the KFD
// topology.
type GPU struct {
	// Node is the KFD topology node number.
	Node int
	// GPUID is the KFD gpu_id.
	GPUID string
	// BusID is the PCI address, such as 0000:c1:00.0.
	BusID string
	// VendorID and DeviceID are the PCI IDs as lower-case hex.
	VendorID, DeviceID string
	// SIMDCount is the number of SIMD units.
	SIMDCount int
	// XCCs is the number of accelerator complexes (XCDs) the node has
	// (num_xcc; 1 when the topology does not say): an MI300X has 8 in
	// the SPX mode, and each of its CPX partitions 1.
	XCCs int
	// RenderMinor is the DRM render minor (128 for renderD128), -1 when
	// unknown.
	RenderMinor int
	// RenderNode and CardNode are host paths; CardNode is "" when the
	// device has no card node (compute-only partitions).
	RenderNode, CardNode string
	// NUMANode is the PCI device's NUMA node or numa.None.
	NUMANode int
	// UniqueID is the KFD unique_id (stable across reboots), "" if absent.
	UniqueID string
	// ComputePartition and MemoryPartition are the partition modes the
	// PCI device reports (SPX, CPX, NPS1, ...), "" when it has none.
	ComputePartition, MemoryPartition string
	// ProductName is the PCI device's product_name, "" if absent.
	ProductName string
	// PCIDir is the local sysfs directory of the PCI device, "" when the
	// device is not found in sysfs.
	PCIDir string
}

// Scan returns the GPUs of the KFD topology in node order. A host without
// KFD (no amdgpu driver) has none.
func Scan(sysfsRoot string) ([]GPU, error) {
	dir := filepath.Join(sysfsRoot, TopologyDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read KFD topology: %w", err)
	}
	nodes := make([]int, 0, len(entries))
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			nodes = append(nodes, n)
		}
	}
	slices.Sort(nodes)
	var gpus []GPU
	var errs []error
	for _, n := range nodes {
		ndir := filepath.Join(dir, strconv.Itoa(n))
		f, err := os.Open(filepath.Join(ndir, "properties"))
		if err != nil {
			errs = append(errs, fmt.Errorf("KFD node %d: %w", n, err))
			continue
		}
		props, err := ParseProperties(f)
		_ = f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("KFD node %d: %w", n, err))
			continue
		}
		if props["simd_count"] <= 0 {
			continue // a CPU node
		}
		g := GPU{
			Node:        n,
			GPUID:       readString(ndir, "gpu_id"),
			VendorID:    fmt.Sprintf("%04x", props["vendor_id"]),
			DeviceID:    fmt.Sprintf("%04x", props["device_id"]),
			SIMDCount:   int(props["simd_count"]),
			XCCs:        int(max(props["num_xcc"], 1)),
			RenderMinor: -1,
			NUMANode:    numa.None,
		}
		if v, ok := props["unique_id"]; ok && v != 0 {
			g.UniqueID = strconv.FormatInt(v, 10)
		}
		if v, ok := props["drm_render_minor"]; ok && v > 0 {
			g.RenderMinor = int(v)
		}
		if loc, ok := props["location_id"]; ok {
			g.BusID = fmt.Sprintf("%04x:%02x:%02x.%x", props["domain"], (loc>>8)&0xff, (loc>>3)&0x1f, loc&7)
		} else if g.RenderMinor >= 0 {
			g.BusID = busFromDRM(sysfsRoot, g.RenderMinor)
		}
		if g.BusID != "" {
			if d, err := pci.Read(sysfsRoot, g.BusID); err == nil {
				g.PCIDir = d.Dir
				g.NUMANode = d.NUMANode
				g.ComputePartition = readString(d.Dir, "current_compute_partition")
				g.MemoryPartition = readString(d.Dir, "current_memory_partition")
				g.ProductName = readString(d.Dir, "product_name")
				cards, renders := d.DRMNodes()
				if len(cards) > 0 {
					g.CardNode = cards[0]
				}
				if g.RenderMinor < 0 && len(renders) > 0 {
					g.RenderMinor, _ = strconv.Atoi(strings.TrimPrefix(filepath.Base(renders[0]), "renderD"))
				}
			}
		}
		if g.RenderMinor >= 0 {
			g.RenderNode = devfs.Host(fmt.Sprintf("dri/renderD%d", g.RenderMinor))
		}
		gpus = append(gpus, g)
	}
	if len(gpus) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return gpus, nil
}

// busFromDRM resolves /sys/class/drm/renderD<minor>/device to a PCI
// address.
func busFromDRM(sysfsRoot string, minor int) string {
	target, err := os.Readlink(filepath.Join(sysfsRoot, "class/drm", fmt.Sprintf("renderD%d", minor), "device"))
	if err != nil {
		return ""
	}
	addr, err := pci.NormalizeAddress(filepath.Base(target))
	if err != nil {
		return ""
	}
	return addr
}

// ParseProperties parses a KFD node properties file: one "name value" pair
// per line, values decimal integers. Lines that do not fit are errors.
func ParseProperties(r io.Reader) (map[string]int64, error) {
	props := make(map[string]int64)
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("properties line %d: want \"name value\", got %q", line, text)
		}
		v, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			u, uerr := strconv.ParseUint(fields[1], 10, 64)
			if uerr != nil {
				return nil, fmt.Errorf("properties line %d: %s: %w", line, fields[0], err)
			}
			v = int64(u) // unique_id uses all 64 bits
		}
		props[fields[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read properties: %w", err)
	}
	return props, nil
}

func readString(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
