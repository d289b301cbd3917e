// Package topology computes NUMA topology hints for device resources and
// merges them with the kubelet's topology manager policies (none,
// best-effort, restricted, single-numa-node).
//
// A Mask is a set of NUMA node IDs (0..63). A Hint is a Mask plus whether
// the allocation it describes is preferred. A Hint with an empty Mask means
// "no NUMA preference" (the kubelet's nil affinity).
package topology

import (
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"
)

// MaxNUMANodes is the largest number of NUMA node IDs a Mask can hold.
const MaxNUMANodes = 64

// Mask is a set of NUMA node IDs; bit i set means node i.
type Mask uint64

// NewMask returns the Mask holding nodes; each must be in [0, 64).
func NewMask(nodes ...int) (Mask, error) {
	var m Mask
	for _, n := range nodes {
		if n < 0 || n >= MaxNUMANodes {
			return 0, fmt.Errorf("NUMA node %d out of range [0, %d)", n, MaxNUMANodes)
		}
		m |= 1 << uint(n)
	}
	return m, nil
}

// Count returns the number of nodes in m.
func (m Mask) Count() int { return bits.OnesCount64(uint64(m)) }

// IsEmpty reports whether m holds no node.
func (m Mask) IsEmpty() bool { return m == 0 }

// IsSet reports whether node is in m.
func (m Mask) IsSet(node int) bool {
	return node >= 0 && node < MaxNUMANodes && m&(1<<uint(node)) != 0
}

// AnySet reports whether m and o share a node.
func (m Mask) AnySet(o Mask) bool { return m&o != 0 }

// IsNarrowerThan orders masks as the kubelet does: fewer nodes first, then
// the mask with the lower-numbered nodes.
func (m Mask) IsNarrowerThan(o Mask) bool {
	if m.Count() == o.Count() {
		return m < o
	}
	return m.Count() < o.Count()
}

// Nodes returns the node IDs in m in increasing order.
func (m Mask) Nodes() []int {
	out := make([]int, 0, m.Count())
	for v := uint64(m); v != 0; v &= v - 1 {
		out = append(out, bits.TrailingZeros64(v))
	}
	return out
}

// String formats m as a comma-separated list of nodes, "none" when empty.
func (m Mask) String() string {
	if m == 0 {
		return "none"
	}
	ns := m.Nodes()
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

// IterateMasks calls fn with every non-empty subset of nodes, smallest
// subsets first, in the kubelet's order.
func IterateMasks(nodes []int, fn func(Mask)) {
	var iterate func(rest []int, accum Mask, left int)
	iterate = func(rest []int, accum Mask, left int) {
		if left == 0 {
			fn(accum)
			return
		}
		for i := range rest {
			iterate(rest[i+1:], accum|1<<uint(rest[i]), left-1)
		}
	}
	for size := 1; size <= len(nodes); size++ {
		iterate(nodes, 0, size)
	}
}

// normalizeNodes returns nodes sorted and de-duplicated.
func normalizeNodes(nodes []int) []int {
	out := append([]int(nil), nodes...)
	sort.Ints(out)
	j := 0
	for i, n := range out {
		if i == 0 || n != out[j-1] {
			out[j] = n
			j++
		}
	}
	return out[:j]
}
