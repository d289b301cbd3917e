package numa

import (
	"cmp"
	"slices"
)

// Candidate is a device that may be chosen.
type Candidate struct {
	ID string
	// Node is the device's NUMA node or None.
	Node int
	// Group, when set, names the physical device a candidate belongs to
	// (a GPU shared by several time-sliced replicas). Pack spreads a
	// request over as many groups as it can within the nodes it picks.
	Group string
}

// Pack chooses size IDs from available, including every ID of mustInclude
// (which may be absent from available; they are still returned), so that
// the answer spans as few NUMA nodes as possible:
//
//   - the nodes of mustInclude are filled first;
//   - then, if one node can hold the rest, the smallest such node (best
//     fit, leaving larger nodes whole for larger requests);
//   - otherwise the node with the most free devices, and so on.
//
// Devices without locality (None) form a node of their own that is used
// last. Within a node devices keep available's order, spread over groups.
// Pack returns fewer than size IDs only when not enough are available.
func Pack(available []Candidate, mustInclude []string, size int) []string {
	out := make([]string, 0, size)
	taken := make(map[string]bool, size)
	byID := make(map[string]Candidate, len(available))
	for _, c := range available {
		byID[c.ID] = c
	}
	used := make(map[int]bool)
	groupsUsed := make(map[string]int)
	for _, id := range mustInclude {
		if len(out) == size || taken[id] {
			continue
		}
		taken[id] = true
		out = append(out, id)
		if c, ok := byID[id]; ok {
			used[c.Node] = true
			if c.Group != "" {
				groupsUsed[c.Group]++
			}
		}
	}
	// Free devices per node, in available's order.
	free := make(map[int][]Candidate)
	var nodes []int
	for _, c := range available {
		if taken[c.ID] {
			continue
		}
		if _, ok := free[c.Node]; !ok {
			nodes = append(nodes, c.Node)
		}
		free[c.Node] = append(free[c.Node], c)
	}
	take := func(node int) {
		for _, c := range spread(free[node], groupsUsed) {
			if len(out) == size {
				break
			}
			taken[c.ID] = true
			out = append(out, c.ID)
			if c.Group != "" {
				groupsUsed[c.Group]++
			}
		}
		delete(free, node)
		nodes = slices.DeleteFunc(nodes, func(n int) bool { return n == node })
	}
	// Nodes already in use first, in a stable order.
	var usedNodes []int
	for _, n := range nodes {
		if used[n] && n != None {
			usedNodes = append(usedNodes, n)
		}
	}
	slices.SortFunc(usedNodes, func(a, b int) int { return cmp.Compare(len(free[b]), len(free[a])) })
	for _, n := range usedNodes {
		if len(out) == size {
			return out
		}
		take(n)
	}
	for len(out) < size && len(nodes) > 0 {
		need := size - len(out)
		best, found, bestFits := None, false, false
		for _, n := range nodes {
			if n == None {
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
			// Only devices without locality remain.
			take(None)
			break
		}
		take(best)
	}
	return out
}

// spread orders a node's candidates so that groups with the fewest devices
// already chosen come first, one device per group per round, keeping the
// input order within a round.
func spread(cands []Candidate, groupsUsed map[string]int) []Candidate {
	if len(cands) < 2 {
		return cands
	}
	hasGroups := false
	for _, c := range cands {
		if c.Group != "" {
			hasGroups = true
			break
		}
	}
	if !hasGroups {
		return cands
	}
	type item struct {
		c     Candidate
		round int
		pos   int
	}
	seen := make(map[string]int)
	items := make([]item, len(cands))
	for i, c := range cands {
		r := groupsUsed[c.Group] + seen[c.Group]
		if c.Group == "" {
			r = 0
		}
		seen[c.Group]++
		items[i] = item{c, r, i}
	}
	slices.SortStableFunc(items, func(a, b item) int {
		if c := cmp.Compare(a.round, b.round); c != 0 {
			return c
		}
		return cmp.Compare(a.pos, b.pos)
	})
	out := make([]Candidate, len(items))
	for i, it := range items {
		out[i] = it.c
	}
	return out
}
