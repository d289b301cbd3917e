package amdgpu

import (
	"slices"
	"strings"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// Compute partitions: a GPU in the DPX, QPX or CPX mode shows the KFD
// topology one node per partition, all at its PCI address. Each partition
// is a device (<bus>-p<n>, as the device plugin front has always offered
// them) that takes its XCCs from a counter set named after the GPU, which
// has all of them: the DRA front publishes them as partitions of one
// device, as it publishes MIG partitions (docs/sharing.md). dpkit does not
// change a GPU's mode; it publishes the partitions the GPU has.

// Counter and attribute names of compute partitions.
const (
	// CounterXCC is the counter of a GPU's accelerator complexes.
	CounterXCC = "xcc"
	// AttrPartition is true on a compute partition and false on a GPU
	// that is whole; AttrProfile is the partition's mode (CPX, ...) and
	// AttrParent its GPU's PCI address.
	AttrPartition = "partition"
	AttrProfile   = "profile"
	AttrParent    = "parent"
)

// modeOf names the mode of a GPU cut into n partitions when the GPU does
// not report it.
func modeOf(n int) string {
	switch n {
	case 2:
		return "DPX"
	case 3:
		return "TPX"
	case 4:
		return "QPX"
	case 8:
		return "CPX"
	}
	return ""
}

// describePartition adds whether g is a partition and, when it is, what
// it takes of its GPU. p.mu is held.
func (p *Plugin) describePartition(g gpu, info *deviceplugin.DeviceInfo) {
	info.Attributes[AttrPartition] = deviceplugin.BoolAttr(g.parts > 1)
	if g.parts <= 1 || g.BusID == "" {
		return
	}
	info.Attributes[AttrProfile] = deviceplugin.StringAttr(cmpOr(g.ComputePartition, modeOf(g.parts)))
	info.Attributes[AttrParent] = deviceplugin.StringAttr(g.BusID)
	info.Attributes["xccs"] = deviceplugin.IntAttr(int64(g.XCCs))
	info.Sharing = &deviceplugin.Sharing{Consumes: []deviceplugin.CounterUse{{
		Set: g.BusID, Counters: map[string]int64{CounterXCC: int64(g.XCCs)},
	}}}
}

var _ deviceplugin.CounterSetter = (*Plugin)(nil)

// CounterSets returns one set per partitioned GPU present, named after its
// PCI address: its XCCs, all of its partitions'.
func (p *Plugin) CounterSets() []deviceplugin.CounterSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	xccs := map[string]int64{}
	for _, g := range p.gpus {
		if g.present && g.parts > 1 && g.BusID != "" {
			xccs[g.BusID] += int64(g.XCCs)
		}
	}
	out := make([]deviceplugin.CounterSet, 0, len(xccs))
	for bus, n := range xccs {
		out = append(out, deviceplugin.CounterSet{Name: bus, Counters: map[string]int64{CounterXCC: n}})
	}
	slices.SortFunc(out, func(a, b deviceplugin.CounterSet) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
