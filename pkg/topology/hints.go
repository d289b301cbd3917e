package topology

// Hint is one possible NUMA placement for a resource request: the nodes the
// devices would come from and whether that placement is preferred (uses the
// fewest NUMA nodes possible). An empty Affinity means "any node".
type Hint struct {
	Affinity  Mask
	Preferred bool
}

// DeviceGroups counts devices by the NUMA nodes they are attached to. The
// key 0 counts devices without NUMA information. Grouping keeps hint
// generation independent of the number of devices.
type DeviceGroups map[Mask]int

// Add counts n more devices attached to mask.
func (g DeviceGroups) Add(mask Mask, n int) {
	if n == 0 {
		return
	}
	g[mask] += n
	if g[mask] == 0 {
		delete(g, mask)
	}
}

// Nodes returns the NUMA nodes any counted device is attached to.
func (g DeviceGroups) Nodes() []int {
	var all Mask
	for m, n := range g {
		if n > 0 {
			all |= m
		}
	}
	return all.Nodes()
}

// HasTopology reports whether any device carries NUMA information; the
// kubelet only generates hints for such resources.
func (g DeviceGroups) HasTopology() bool {
	for m, n := range g {
		if m != 0 && n > 0 {
			return true
		}
	}
	return false
}

// countIn returns how many devices are attached to a node in mask.
func (g DeviceGroups) countIn(mask Mask) int {
	c := 0
	for m, n := range g {
		if m.AnySet(mask) {
			c += n
		}
	}
	return c
}

// DeviceHints returns the hints for a request of request devices, as the
// kubelet's device manager computes them: for every combination of the NUMA
// nodes that host devices of the resource (restricted to machineNodes when
// that is non-empty), a hint when the reusable devices (devices already
// handed to the pod's init containers) all lie within it and reusable plus
// available devices within it cover the request. A hint is preferred when
// its node count equals the smallest count that could hold the request
// among all devices of the resource.
//
// all counts every device of the resource, available the healthy devices not
// in use, reusable the devices reusable from init containers. The result is
// empty (not nil) when no combination fits.
func DeviceHints(machineNodes []int, all, available, reusable DeviceGroups, request int) []Hint {
	nodes := all.Nodes()
	if len(machineNodes) > 0 {
		known, _ := NewMask(normalizeNodes(clampNodes(machineNodes))...)
		var m Mask
		for _, n := range nodes {
			if known.IsSet(n) {
				m |= 1 << uint(n)
			}
		}
		nodes = m.Nodes()
		if len(nodes) == 0 {
			nodes = known.Nodes()
		}
	}
	minAffinity := len(nodes)
	hints := []Hint{}
	IterateMasks(nodes, func(mask Mask) {
		if all.countIn(mask) >= request && mask.Count() < minAffinity {
			minAffinity = mask.Count()
		}
		matching := 0
		for m, n := range reusable {
			if m == 0 {
				continue
			}
			if !m.AnySet(mask) {
				return
			}
			matching += n
		}
		matching += available.countIn(mask)
		if matching < request {
			return
		}
		hints = append(hints, Hint{Affinity: mask})
	})
	for i := range hints {
		if hints[i].Affinity.Count() == minAffinity {
			hints[i].Preferred = true
		}
	}
	return hints
}

func clampNodes(nodes []int) []int {
	out := make([]int, 0, len(nodes))
	for _, n := range nodes {
		if n >= 0 && n < MaxNUMANodes {
			out = append(out, n)
		}
	}
	return out
}
