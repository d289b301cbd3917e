package deviceplugin

import (
	"cmp"
	"slices"
	"strconv"
)

// PackNUMA answers a preferred allocation request by packing it onto as few
// NUMA nodes as possible: the devices in MustInclude first, then more from
// the NUMA nodes they already use, then from the single node that can hold
// the rest with the least left over (keeping larger free blocks whole for
// later requests), and otherwise from the nodes with the most free devices.
// Devices without NUMA information form their own group. Unhealthy devices
// are never chosen. Within a node, IDs are taken in natural order (dev-2
// before dev-10).
//
// Plugins call it from PreferredAllocation:
//
//	func (p *myPlugin) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
//		return deviceplugin.PackNUMA(req), nil
//	}
func PackNUMA(req PreferredAllocationRequest) []string {
	out := make([]string, 0, req.Size)
	taken := make(map[string]bool, req.Size)
	byID := make(map[string]Device, len(req.Available))
	for _, d := range req.Available {
		byID[d.ID] = d
	}
	used := make(map[int64]bool)
	for _, id := range req.MustInclude {
		if len(out) == req.Size || taken[id] {
			continue
		}
		taken[id] = true
		out = append(out, id)
		used[numaOf(byID[id])] = true
	}

	groups := make(map[int64][]Device)
	for _, d := range req.Available {
		if d.Healthy && !taken[d.ID] {
			n := numaOf(d)
			groups[n] = append(groups[n], d)
		}
	}
	nodes := make([]int64, 0, len(groups))
	for n, g := range groups {
		slices.SortFunc(g, func(a, b Device) int { return CompareIDs(a.ID, b.ID) })
		nodes = append(nodes, n)
	}
	slices.Sort(nodes)
	take := func(n int64) {
		for _, d := range groups[n] {
			if len(out) == req.Size {
				break
			}
			taken[d.ID] = true
			out = append(out, d.ID)
		}
		groups[n] = nil
	}
	// Nodes the must-include devices already sit on come first.
	for _, n := range nodes {
		if used[n] {
			take(n)
		}
	}
	if need := req.Size - len(out); need > 0 {
		best := int64(-2)
		for _, n := range nodes {
			if g := len(groups[n]); g >= need && (best == -2 || g < len(groups[best])) {
				best = n
			}
		}
		if best != -2 {
			take(best)
		}
	}
	slices.SortStableFunc(nodes, func(a, b int64) int { return cmp.Compare(len(groups[b]), len(groups[a])) })
	for _, n := range nodes {
		if len(out) == req.Size {
			break
		}
		take(n)
	}
	return out
}

// numaOf returns a device's first NUMA node, or -1 when it has none.
func numaOf(d Device) int64 {
	if len(d.NUMANodes) == 0 {
		return -1
	}
	return d.NUMANodes[0]
}

// CompareIDs orders device IDs naturally: embedded numbers compare as
// numbers, so dev-2 sorts before dev-10.
func CompareIDs(a, b string) int {
	for a != "" && b != "" {
		ai, bi := digitsPrefix(a), digitsPrefix(b)
		if ai > 0 && bi > 0 {
			an, _ := strconv.ParseUint(a[:ai], 10, 64)
			bn, _ := strconv.ParseUint(b[:bi], 10, 64)
			if c := cmp.Compare(an, bn); c != 0 {
				return c
			}
			a, b = a[ai:], b[bi:]
			continue
		}
		if c := cmp.Compare(a[0], b[0]); c != 0 {
			return c
		}
		a, b = a[1:], b[1:]
	}
	return cmp.Compare(len(a), len(b))
}

func digitsPrefix(s string) int {
	i := 0
	for i < len(s) && i < 18 && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i
}
