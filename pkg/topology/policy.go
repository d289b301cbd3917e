package topology

import (
	"fmt"
	"sort"
)

// Policy names, as in the kubelet's --topology-manager-policy.
const (
	PolicyNone           = "none"
	PolicyBestEffort     = "best-effort"
	PolicyRestricted     = "restricted"
	PolicySingleNUMANode = "single-numa-node"
)

// Scope names, as in the kubelet's --topology-manager-scope.
const (
	ScopeContainer = "container"
	ScopePod       = "pod"
)

// MaxAllowableNUMANodes is the kubelet's default limit on NUMA nodes for
// policies other than none: merging hints is exponential in the node count.
const MaxAllowableNUMANodes = 8

// Policies lists the supported policy names.
func Policies() []string {
	return []string{PolicyNone, PolicyBestEffort, PolicyRestricted, PolicySingleNUMANode}
}

// Policy merges the hints of every hint provider into one placement and
// decides whether the pod may be admitted with it.
type Policy interface {
	// Name returns the policy name.
	Name() string
	// Merge merges per-provider hints, keyed by resource name. A nil hint
	// slice means the resource has no NUMA preference; an empty non-nil
	// slice means no placement can satisfy it. It returns the chosen hint
	// and whether the pod may be admitted.
	Merge(providers []map[string][]Hint) (Hint, bool)
}

// NewPolicy returns the named policy for a machine with the given NUMA
// nodes. An empty name means none.
func NewPolicy(name string, numaNodes []int) (Policy, error) {
	nodes := normalizeNodes(numaNodes)
	if name != "" && name != PolicyNone {
		if len(nodes) > MaxAllowableNUMANodes {
			return nil, fmt.Errorf("topology policy %q is unsupported on machines with more than %d NUMA nodes (have %d)", name, MaxAllowableNUMANodes, len(nodes))
		}
		if len(nodes) == 0 {
			return nil, fmt.Errorf("topology policy %q needs the machine's NUMA nodes; set them or use %q", name, PolicyNone)
		}
	}
	def, err := NewMask(nodes...)
	if err != nil {
		return nil, err
	}
	switch name {
	case "", PolicyNone:
		return nonePolicy{}, nil
	case PolicyBestEffort:
		return mergePolicy{name: name, def: def}, nil
	case PolicyRestricted:
		return mergePolicy{name: name, def: def, requirePreferred: true}, nil
	case PolicySingleNUMANode:
		return mergePolicy{name: name, def: def, requirePreferred: true, singleNode: true}, nil
	}
	return nil, fmt.Errorf("unknown topology policy %q; use one of %v", name, Policies())
}

type nonePolicy struct{}

func (nonePolicy) Name() string                           { return PolicyNone }
func (nonePolicy) Merge([]map[string][]Hint) (Hint, bool) { return Hint{}, true }

type mergePolicy struct {
	name             string
	def              Mask
	requirePreferred bool
	singleNode       bool
}

func (p mergePolicy) Name() string { return p.name }

func (p mergePolicy) Merge(providers []map[string][]Hint) (Hint, bool) {
	hints := filterProviderHints(providers)
	if p.singleNode {
		hints = filterSingleNUMA(hints)
	}
	best := merge(p.def, hints)
	if p.singleNode && best.Affinity == p.def {
		best.Affinity = 0
	}
	if p.requirePreferred {
		return best, best.Preferred
	}
	return best, true
}

// filterProviderHints flattens providers into one hint list per resource,
// turning "no preference" into a preferred any-node hint and "impossible"
// into a non-preferred any-node hint. Resources are visited in name order
// so the result does not depend on map iteration.
func filterProviderHints(providers []map[string][]Hint) [][]Hint {
	var out [][]Hint
	for _, hints := range providers {
		if len(hints) == 0 {
			out = append(out, []Hint{{Preferred: true}})
			continue
		}
		names := make([]string, 0, len(hints))
		for r := range hints {
			names = append(names, r)
		}
		sort.Strings(names)
		for _, r := range names {
			switch h := hints[r]; {
			case h == nil:
				out = append(out, []Hint{{Preferred: true}})
			case len(h) == 0:
				out = append(out, []Hint{{Preferred: false}})
			default:
				out = append(out, h)
			}
		}
	}
	return out
}

func filterSingleNUMA(all [][]Hint) [][]Hint {
	out := make([][]Hint, 0, len(all))
	for _, hints := range all {
		var f []Hint
		for _, h := range hints {
			if h.Preferred && (h.Affinity == 0 || h.Affinity.Count() == 1) {
				f = append(f, h)
			}
		}
		out = append(out, f)
	}
	return out
}

// merge tries every permutation of one hint per resource, ANDs their masks
// and keeps the best result with the kubelet's comparison rules.
func merge(def Mask, all [][]Hint) Hint {
	bestNonPreferred := 0
	for _, hints := range all {
		var narrowest Mask
		found := false
		for _, h := range hints {
			if h.Affinity == 0 {
				continue
			}
			if !found || h.Affinity.IsNarrowerThan(narrowest) {
				narrowest, found = h.Affinity, true
			}
		}
		if found && narrowest.Count() > bestNonPreferred {
			bestNonPreferred = narrowest.Count()
		}
	}
	var best *Hint
	perm := make([]Hint, len(all))
	var iterate func(i int)
	iterate = func(i int) {
		if i == len(all) {
			c := mergePermutation(def, perm)
			best = compare(best, &c, bestNonPreferred)
			return
		}
		for _, h := range all[i] {
			perm[i] = h
			iterate(i + 1)
		}
	}
	iterate(0)
	if best == nil {
		return Hint{Affinity: def}
	}
	return *best
}

func mergePermutation(def Mask, perm []Hint) Hint {
	preferred := true
	merged := def
	var first Mask
	seen := false
	for _, h := range perm {
		if h.Affinity != 0 {
			if !seen {
				first, seen = h.Affinity, true
			} else if h.Affinity != first {
				preferred = false
			}
			merged &= h.Affinity
		}
		if !h.Preferred {
			preferred = false
		}
	}
	return Hint{Affinity: merged, Preferred: preferred}
}

func narrower(cur, cand *Hint) *Hint {
	if cand.Affinity == cur.Affinity || !cand.Affinity.IsNarrowerThan(cur.Affinity) {
		return cur
	}
	return cand
}

func compare(cur, cand *Hint, bestNonPreferred int) *Hint {
	if cand.Affinity.Count() == 0 {
		return cur
	}
	if cur == nil {
		return cand
	}
	switch {
	case !cur.Preferred && cand.Preferred:
		return cand
	case cur.Preferred && !cand.Preferred:
		return cur
	case cur.Preferred && cand.Preferred:
		return narrower(cur, cand)
	}
	cc, nc := cur.Affinity.Count(), cand.Affinity.Count()
	switch {
	case cc > bestNonPreferred:
		return narrower(cur, cand)
	case cc == bestNonPreferred:
		if nc != bestNonPreferred {
			return cur
		}
		return narrower(cur, cand)
	case nc > bestNonPreferred:
		return cur
	case nc == bestNonPreferred:
		return cand
	case nc > cc:
		return cand
	case nc < cc:
		return cur
	}
	return narrower(cur, cand)
}
