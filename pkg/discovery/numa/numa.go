// Package numa reads the NUMA locality of devices from sysfs. Choosing
// devices on few NUMA nodes is the SDK's deviceplugin.PackNUMA.
package numa

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

// None is the node of a device the host reports no locality for (sysfs
// numa_node -1, a missing file, or a host without NUMA).
const None = -1

// NodesDir is where sysfs lists the machine's NUMA nodes, below the sysfs
// root: one directory node<N> per node.
const NodesDir = "devices/system/node"

// ReadNodes returns the IDs of the NUMA nodes sysfs (mounted at sysfsRoot)
// lists, sorted; none when the directory is missing (a kernel without NUMA
// support). The kubelet reads them from the same place, through cAdvisor.
func ReadNodes(sysfsRoot string) ([]int, error) {
	dir := filepath.Join(sysfsRoot, NodesDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the NUMA nodes: %w", err)
	}
	var ids []int
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), "node")
		if !ok || !e.IsDir() && e.Type()&fs.ModeSymlink == 0 {
			continue
		}
		id, err := strconv.Atoi(digits)
		if err != nil || id < 0 || strconv.Itoa(id) != digits {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// ReadNode reads dir/numa_node. A missing or unreadable file, -1 or junk
// give None.
func ReadNode(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "numa_node"))
	if err != nil {
		return None
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return None
	}
	return n
}

// NodeOfSysPath returns the NUMA node of the device at sysfs directory dir
// or of its nearest ancestor that has a numa_node file (a USB device takes
// its host controller's node). It stops at stop (the sysfs root).
func NodeOfSysPath(dir, stop string) int {
	dir = filepath.Clean(dir)
	stop = filepath.Clean(stop)
	for strings.HasPrefix(dir, stop) && dir != stop {
		if _, err := os.Stat(filepath.Join(dir, "numa_node")); err == nil {
			return ReadNode(dir)
		}
		dir = filepath.Dir(dir)
	}
	return None
}

// Nodes returns the node as the SDK's Device.NUMANodes: nil for None.
func Nodes(n int) []int64 {
	if n < 0 {
		return nil
	}
	return []int64{int64(n)}
}
