package deviceplugin

import (
	"cmp"
	"slices"

	"github.com/dpkit/dpkit/internal/natural"
)

// noNUMA is the node of a device without NUMA information.
const noNUMA = -1

// PackNUMA answers a preferred allocation request by packing it onto as few
// NUMA nodes as possible:
//
//   - the devices in MustInclude first (kept even if not available), then
//     more from the NUMA nodes they sit on;
//   - then, if one node can hold the rest, the smallest such node (best
//     fit, keeping larger nodes whole for larger requests);
//   - otherwise the node with the most free devices, and so on.
//
// Devices without NUMA information form a node of their own that is used
// last. Unhealthy devices are never chosen. Within a node, IDs are taken in
// natural order (dev-2 before dev-10). PackNUMA returns fewer than Size IDs
// only when not enough are available.
//
// Plugins call it from PreferredAllocation:
//
//	func (p *myPlugin) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
//		return deviceplugin.PackNUMA(req), nil
//	}
func PackNUMA(req PreferredAllocationRequest) []string {
	req.Available = slices.Clone(req.Available)
	slices.SortStableFunc(req.Available, func(a, b Device) int { return CompareIDs(a.ID, b.ID) })
	return PackNUMAGroups(req, nil)
}

// PackNUMAGroups is PackNUMA for devices offered under several IDs, such as
// time-sliced replicas of one GPU: group returns the physical device an ID
// belongs to, and within the NUMA nodes it picks the request is spread over
// as many groups as possible (one ID per group per round). Within a node,
// IDs keep the order of req.Available. group may be nil.
func PackNUMAGroups(req PreferredAllocationRequest, group func(id string) string) []string {
	size := max(req.Size, 0)
	out := make([]string, 0, size)
	taken := make(map[string]bool, size)
	nodeOf := make(map[string]int64, len(req.Available))
	for _, d := range req.Available {
		nodeOf[d.ID] = numaOf(d)
	}
	groupOf := func(id string) string {
		if group == nil {
			return ""
		}
		return group(id)
	}
	used := make(map[int64]bool)
	groupsUsed := make(map[string]int)
	for _, id := range req.MustInclude {
		if len(out) == size || taken[id] {
			continue
		}
		taken[id] = true
		out = append(out, id)
		if n, ok := nodeOf[id]; ok {
			used[n] = true
			if g := groupOf(id); g != "" {
				groupsUsed[g]++
			}
		}
	}
	// Free devices per node, in the input's order.
	free := make(map[int64][]string)
	var nodes []int64
	for _, d := range req.Available {
		if taken[d.ID] || !d.Healthy {
			continue
		}
		n := numaOf(d)
		if _, ok := free[n]; !ok {
			nodes = append(nodes, n)
		}
		free[n] = append(free[n], d.ID)
	}
	take := func(node int64) {
		ids := free[node]
		if group != nil {
			ids = spreadGroups(ids, group, groupsUsed)
		}
		for _, id := range ids {
			if len(out) == size {
				break
			}
			taken[id] = true
			out = append(out, id)
			if g := groupOf(id); g != "" {
				groupsUsed[g]++
			}
		}
		delete(free, node)
		nodes = slices.DeleteFunc(nodes, func(n int64) bool { return n == node })
	}
	// Nodes the must-include devices sit on come first, fullest first.
	var usedNodes []int64
	for _, n := range nodes {
		if used[n] && n != noNUMA {
			usedNodes = append(usedNodes, n)
		}
	}
	slices.SortStableFunc(usedNodes, func(a, b int64) int { return cmp.Compare(len(free[b]), len(free[a])) })
	for _, n := range usedNodes {
		if len(out) == size {
			return out
		}
		take(n)
	}
	for len(out) < size && len(nodes) > 0 {
		need := size - len(out)
		var best int64
		found, bestFits := false, false
		for _, n := range nodes {
			if n == noNUMA {
				continue
			}
			fits := len(free[n]) >= need
			switch {
			case !found:
				best, found, bestFits = n, true, fits
			case fits && !bestFits,
				fits && bestFits && len(free[n]) < len(free[best]),
				!fits && !bestFits && len(free[n]) > len(free[best]):
				best, bestFits = n, fits
			}
		}
		if !found {
			take(noNUMA) // only devices without NUMA information remain
			break
		}
		take(best)
	}
	return out
}

// spreadGroups orders a node's IDs so that groups with the fewest IDs
// already chosen come first, one ID per group per round, keeping the input
// order within a round.
func spreadGroups(ids []string, groupOf func(string) string, groupsUsed map[string]int) []string {
	if len(ids) < 2 {
		return ids
	}
	type item struct {
		id         string
		round, pos int
	}
	seen := make(map[string]int)
	items := make([]item, len(ids))
	for i, id := range ids {
		g := groupOf(id)
		r := 0
		if g != "" {
			r = groupsUsed[g] + seen[g]
			seen[g]++
		}
		items[i] = item{id, r, i}
	}
	slices.SortStableFunc(items, func(a, b item) int {
		if c := cmp.Compare(a.round, b.round); c != 0 {
			return c
		}
		return cmp.Compare(a.pos, b.pos)
	})
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.id
	}
	return out
}

// numaOf returns a device's first NUMA node, or noNUMA when it has none.
func numaOf(d Device) int64 {
	if len(d.NUMANodes) == 0 {
		return noNUMA
	}
	return d.NUMANodes[0]
}

// CompareIDs orders device IDs naturally: runs of digits compare by value
// (of any length), so dev-2 sorts before dev-10 and renderD128 before
// renderD1024.
func CompareIDs(a, b string) int { return natural.Compare(a, b) }
