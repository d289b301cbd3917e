package emulator

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

// NUMANodesDir is where sysfs lists the machine's NUMA nodes, below the
// sysfs root: one directory node<N> per node.
const NUMANodesDir = "devices/system/node"

// ReadNUMANodes returns the IDs of the NUMA nodes sysfs (mounted at
// sysfsRoot) lists, sorted; none when the directory is missing (a kernel
// without NUMA support). The kubelet reads them from the same place,
// through cAdvisor.
func ReadNUMANodes(sysfsRoot string) ([]int, error) {
	dir := filepath.Join(sysfsRoot, NUMANodesDir)
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
