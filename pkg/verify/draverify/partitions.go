package draverify

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// Partitionable devices (KEP-4815): a pool defines counter sets
// (spec.sharedCounters, in slices of their own) and its devices consume
// them (spec.devices[].consumesCounters). The API server validates each
// slice alone; what spans slices, the scheduler checks when it gathers
// the pool (k8s.io/dynamic-resource-allocation/structured, buildPool):
// a device that consumes a set or a counter the pool does not define, or
// a set defined twice, makes the whole pool invalid, and a device that
// consumes more than its set holds never fits (checkAvailableCounters).

// newestPools groups sl by pool, keeping the slices of each pool's
// newest generation: the ones the scheduler uses.
func newestPools(sl []resourcev1.ResourceSlice) map[string][]resourcev1.ResourceSlice {
	out := map[string][]resourcev1.ResourceSlice{}
	for _, s := range sl {
		pool := s.Spec.Pool.Name
		if gen := newestGeneration(sl, pool); s.Spec.Pool.Generation == gen {
			out[pool] = append(out[pool], s)
		}
	}
	for pool := range out {
		sort.Slice(out[pool], func(i, j int) bool { return out[pool][i].Name < out[pool][j].Name })
	}
	return out
}

// counterProblems lists what makes the counters of one pool's newest
// generation unusable, and counts its counter sets and the devices that
// consume them.
func counterProblems(pool string, sl []resourcev1.ResourceSlice) (problems []string, sets, consumers int) {
	type set struct {
		slice    string
		counters map[string]resourcev1.Counter
	}
	defined := map[string]set{}
	for _, s := range sl {
		for _, cs := range s.Spec.SharedCounters {
			sets++
			if other, dup := defined[cs.Name]; dup {
				problems = append(problems, fmt.Sprintf("pool %s defines counter set %s in %s and in %s: the scheduler takes the pool as invalid and allocates none of its devices", pool, cs.Name, other.slice, s.Name))
				continue
			}
			defined[cs.Name] = set{s.Name, cs.Counters}
		}
	}
	gen := int64(-1)
	if len(sl) > 0 {
		gen = sl[0].Spec.Pool.Generation
	}
	for _, s := range sl {
		for _, d := range s.Spec.Devices {
			if len(d.ConsumesCounters) > 0 {
				consumers++
			}
			for _, c := range d.ConsumesCounters {
				cs, ok := defined[c.CounterSet]
				if !ok {
					problems = append(problems, fmt.Sprintf("device %s (%s) consumes counter set %s, which pool %s does not define in generation %d: the scheduler takes the pool as invalid and allocates none of its devices", d.Name, s.Name, c.CounterSet, pool, gen))
					continue
				}
				names := make([]string, 0, len(c.Counters))
				for n := range c.Counters {
					names = append(names, n)
				}
				sort.Strings(names)
				for _, n := range names {
					have, ok := cs.counters[n]
					want := c.Counters[n]
					switch {
					case !ok:
						problems = append(problems, fmt.Sprintf("device %s (%s) consumes counter %s of set %s, which the set (%s) does not define: the scheduler takes pool %s as invalid and allocates none of its devices", d.Name, s.Name, n, c.CounterSet, cs.slice, pool))
					case want.Value.Cmp(have.Value) > 0:
						problems = append(problems, fmt.Sprintf("device %s (%s) consumes %s of counter %s/%s, which holds %s: the scheduler never allocates it", d.Name, s.Name, want.Value.String(), c.CounterSet, n, have.Value.String()))
					}
				}
			}
		}
	}
	return problems, sets, consumers
}

// checkPartitions judges dra.slices.partitionable on the driver's
// slices for the node.
func (r *run) checkPartitions(sl []resourcev1.ResourceSlice, listErr error) {
	id := verify.CheckDRAPartitionable
	if listErr != nil {
		r.set(id, verify.Skip, "%v", listErr)
		return
	}
	pools := newestPools(sl)
	names := make([]string, 0, len(pools))
	for p := range pools {
		names = append(names, p)
	}
	sort.Strings(names)
	var problems, used []string
	for _, p := range names {
		pr, sets, consumers := counterProblems(p, pools[p])
		if sets == 0 && consumers == 0 {
			continue
		}
		problems = append(problems, pr...)
		used = append(used, fmt.Sprintf("pool %s: %d counter set(s), %d device(s) consuming them", p, sets, consumers))
	}
	switch {
	case len(used) == 0:
		r.set(id, verify.Skip, "no pool of the driver for node %s uses sharedCounters or consumesCounters: the driver publishes no partitionable devices", r.node)
	case len(problems) > 0:
		r.set(id, verify.Fail, "%s", strings.Join(problems, "; "))
	default:
		r.set(id, verify.Pass, "%s; every set and counter consumed is defined once in its pool, and each device's consumption fits its counter", strings.Join(used, "; "))
	}
}

// fitTogether keeps, of names (devices of one pool's newest slices sl),
// devices whose counters all fit their sets at once: a whole GPU and its
// partitions are never allocated together, so a check that holds several
// devices at once takes the partitions that fit (the smallest first, as
// many as fit). Devices that consume no counters are all kept; the order
// of names is kept.
func fitTogether(sl []resourcev1.ResourceSlice, names []string) []string {
	left := map[string]map[string]int64{}
	for _, s := range sl {
		for _, cs := range s.Spec.SharedCounters {
			left[cs.Name] = map[string]int64{}
			for n, c := range cs.Counters {
				left[cs.Name][n] = c.Value.MilliValue()
			}
		}
	}
	consumes := map[string][]resourcev1.DeviceCounterConsumption{}
	for _, s := range sl {
		for _, d := range s.Spec.Devices {
			consumes[d.Name] = d.ConsumesCounters
		}
	}
	// A device's size: the largest share of a set's counter it takes.
	size := func(name string) float64 {
		var most float64
		for _, c := range consumes[name] {
			for n, q := range c.Counters {
				if total := left[c.CounterSet][n]; total > 0 {
					most = max(most, float64(q.Value.MilliValue())/float64(total))
				}
			}
		}
		return most
	}
	order := slices.Clone(names)
	sort.SliceStable(order, func(i, j int) bool { return size(order[i]) < size(order[j]) })
	kept := map[string]bool{}
	for _, name := range order {
		fits := true
		for _, c := range consumes[name] {
			for n, q := range c.Counters {
				if left[c.CounterSet][n] < q.Value.MilliValue() {
					fits = false
				}
			}
		}
		if !fits {
			continue
		}
		for _, c := range consumes[name] {
			for n, q := range c.Counters {
				if left[c.CounterSet] != nil {
					left[c.CounterSet][n] -= q.Value.MilliValue()
				}
			}
		}
		kept[name] = true
	}
	return slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !kept[n] })
}
