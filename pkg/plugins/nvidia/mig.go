package nvidia

import (
	"fmt"
	"slices"
	"strings"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	nv "github.com/dpkit/dpkit/pkg/discovery/nvidia"
)

// MIG partitions (Config.MIG): each GPU of a model with a MIG layout is
// published with its partitions, one per instance of each profile it can
// hold, which take its compute and memory slices from a counter set named
// after the GPU's UUID. The whole GPU takes all of them.

// Counter and attribute names of MIG partitions.
const (
	CounterComputeSlices = "compute-slices"
	CounterMemorySlices  = "memory-slices"
	// AttrPartition is false on a whole GPU and true on a partition;
	// AttrProfile is a partition's MIG profile, such as "1g.10gb".
	AttrPartition = "partition"
	AttrProfile   = "profile"
)

// migID names instance n of a profile of GPU uuid.
func migID(uuid, profile string, n int) string {
	return fmt.Sprintf("%s%s%s-%d", uuid, ReplicaSeparator, profile, n)
}

// migLayout returns g's MIG layout when partitions are on and dpkit
// knows its model.
func (p *Plugin) migLayout(g gpu) (nv.MIGLayout, bool) {
	if p.cfg.MIG != MIGPartitions {
		return nv.MIGLayout{}, false
	}
	return nv.MIGLayoutOf(g.Model)
}

// describeMIG adds what a GPU or partition id takes of the GPU's slices.
// p.mu is held.
func (p *Plugin) describeMIG(g gpu, id string, info *deviceplugin.DeviceInfo) {
	if p.cfg.MIG != MIGPartitions {
		return
	}
	l, ok := nv.MIGLayoutOf(g.Model)
	if !ok {
		// Every GPU says whether it is a partition, so that selectors
		// (the DeviceClass's) may read the attribute of every device.
		info.Attributes[AttrPartition] = deviceplugin.BoolAttr(false)
		return
	}
	if id == g.UUID {
		info.Attributes[AttrPartition] = deviceplugin.BoolAttr(false)
		info.Sharing = &deviceplugin.Sharing{Consumes: []deviceplugin.CounterUse{{Set: g.UUID, Counters: map[string]int64{
			CounterComputeSlices: int64(l.ComputeSlices), CounterMemorySlices: int64(l.MemorySlices),
		}}}}
		return
	}
	_, rest, _ := strings.Cut(id, ReplicaSeparator)
	i := strings.LastIndex(rest, "-")
	name := rest[:max(i, 0)]
	at := slices.IndexFunc(l.Profiles, func(pr nv.MIGProfile) bool { return pr.Name == name })
	if at < 0 {
		return
	}
	pr := l.Profiles[at]
	info.Attributes[AttrPartition] = deviceplugin.BoolAttr(true)
	info.Attributes[AttrProfile] = deviceplugin.StringAttr(pr.Name)
	info.Sharing = &deviceplugin.Sharing{DRAOnly: true, Consumes: []deviceplugin.CounterUse{{Set: g.UUID, Counters: map[string]int64{
		CounterComputeSlices: int64(pr.ComputeSlices), CounterMemorySlices: int64(pr.MemorySlices),
	}}}}
}

var _ deviceplugin.CounterSetter = (*Plugin)(nil)

// CounterSets returns the slices of every GPU with MIG partitions.
func (p *Plugin) CounterSets() []deviceplugin.CounterSet {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []deviceplugin.CounterSet
	for _, g := range p.gpus {
		if l, ok := p.migLayout(g); ok {
			out = append(out, deviceplugin.CounterSet{Name: g.UUID, Counters: map[string]int64{
				CounterComputeSlices: int64(l.ComputeSlices), CounterMemorySlices: int64(l.MemorySlices),
			}})
		}
	}
	slices.SortFunc(out, func(a, b deviceplugin.CounterSet) int { return strings.Compare(a.Name, b.Name) })
	return out
}
