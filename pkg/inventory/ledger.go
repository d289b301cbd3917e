package inventory

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// The ledger: what each device takes of what, read from the plugin's
// Describe (DeviceInfo.Sharing) and CounterSets at every snapshot. A grant
// is admitted only while everything it takes still fits:
//
//   - a device without Sharing.Shared is held by one holder at a time;
//   - a shared device's shares never add up to more than a capacity's
//     total, and a ShareOf device (a device plugin replica) takes its
//     amounts from its shared device;
//   - a device's Consumes are taken from the counter sets while anyone
//     holds it (once for a shared device, however many shares), and the
//     sets are never overdrawn: a whole GPU is never given while one of
//     its partitions is held, nor a partition while the GPU is.

// ledger is the sharing rules of one snapshot.
type ledger struct {
	sharing map[string]*deviceplugin.Sharing // device ID -> its rules; absent: held whole
	sets    map[string]map[string]int64      // counter set -> counter -> total
	setList []deviceplugin.CounterSet        // the sets as the plugin listed them
	// children lists the ShareOf devices of each shared device.
	children map[string][]string
}

// readLedger asks the plugin for the rules of devs. It is called without
// inv.mu held: a plugin's Describe may take its own locks.
func readLedger(p deviceplugin.Plugin, devs []deviceplugin.Device) ledger {
	l := readSharing(p, devs)
	l.sets = map[string]map[string]int64{}
	if cs, ok := p.(deviceplugin.CounterSetter); ok {
		for _, set := range cs.CounterSets() {
			if _, dup := l.sets[set.Name]; dup {
				continue
			}
			l.sets[set.Name] = maps.Clone(set.Counters)
			l.setList = append(l.setList, deviceplugin.CounterSet{Name: set.Name, Counters: maps.Clone(set.Counters)})
		}
	}
	return l
}

// readSharing reads how devs share, as readLedger does, without the
// counter sets.
func readSharing(p deviceplugin.Plugin, devs []deviceplugin.Device) ledger {
	l := ledger{sharing: map[string]*deviceplugin.Sharing{}, children: map[string][]string{}}
	if d, ok := p.(deviceplugin.Describer); ok {
		for _, dev := range devs {
			if info, ok := d.Describe(dev.ID); ok && info.Sharing != nil {
				l.sharing[dev.ID] = info.Sharing
				if info.Sharing.ShareOf != "" {
					l.children[info.Sharing.ShareOf] = append(l.children[info.Sharing.ShareOf], dev.ID)
				}
			}
		}
	}
	return l
}

// shared reports whether id is a shared device.
func (l *ledger) shared(id string) bool {
	s := l.sharing[id]
	return s != nil && len(s.Shared) > 0
}

// shareOf returns the shared device a replica takes from, "" for others.
func (l *ledger) shareOf(id string) string {
	if s := l.sharing[id]; s != nil && s.ShareOf != "" && l.shared(s.ShareOf) {
		return s.ShareOf
	}
	return ""
}

// chargeKey is the device whose Consumes a hold of id charges: a
// replica's shared device, or id.
func (l *ledger) chargeKey(id string) string {
	if p := l.shareOf(id); p != "" {
		return p
	}
	return id
}

// amounts returns what a grant takes of the capacities of the shared
// device it draws on: asked amounts rounded up to Min + n*Step, defaults
// for capacities not asked. A replica takes its ShareAmounts. The error
// names the capacity.
func (l *ledger) amounts(g Grant) (map[string]int64, error) {
	target, asked := g.Device, g.Amounts
	if p := l.shareOf(g.Device); p != "" {
		target, asked = p, l.sharing[g.Device].ShareAmounts
	}
	if !l.shared(target) {
		return nil, nil
	}
	caps := l.sharing[target].Shared
	out := make(map[string]int64, len(caps))
	for name, c := range caps {
		v, ok := asked[name]
		if !ok {
			v = c.Default
		}
		out[name] = roundUp(v, c)
	}
	for name := range asked {
		if _, ok := caps[name]; !ok {
			return nil, fmt.Errorf("device %q has no shared capacity %q (it shares %s)", g.Device, name, strings.Join(sortedNames(caps), ", "))
		}
	}
	return out, nil
}

func roundUp(v int64, c deviceplugin.SharedCapacity) int64 {
	if v <= c.Min {
		return c.Min
	}
	step := max(c.Step, 1)
	n := (v - c.Min + step - 1) / step
	return c.Min + n*step
}

func sortedNames[V any](m map[string]V) []string {
	out := slices.Collect(maps.Keys(m))
	sort.Strings(out)
	return out
}

// usage is what the holds in a state take: capacity used per shared
// device, counters used per set, and the devices charged.
type usage struct {
	capacity map[string]map[string]int64 // shared device -> capacity -> used
	counters map[string]map[string]int64 // set -> counter -> used
	charged  map[string]bool             // chargeKey -> its Consumes are taken
}

func (l *ledger) usage(holds map[string][]hold, skip func(id string, h hold) bool) usage {
	u := usage{capacity: map[string]map[string]int64{}, counters: map[string]map[string]int64{}, charged: map[string]bool{}}
	for id, hs := range holds {
		for _, h := range hs {
			if skip != nil && skip(id, h) {
				continue
			}
			if target := l.chargeKeyShared(id); target != "" {
				if u.capacity[target] == nil {
					u.capacity[target] = map[string]int64{}
				}
				for c, v := range h.amounts {
					u.capacity[target][c] += v
				}
			}
			key := l.chargeKey(id)
			if u.charged[key] {
				continue
			}
			u.charged[key] = true
			if s := l.sharing[key]; s != nil {
				for _, use := range s.Consumes {
					if u.counters[use.Set] == nil {
						u.counters[use.Set] = map[string]int64{}
					}
					for c, v := range use.Counters {
						u.counters[use.Set][c] += v
					}
				}
			}
		}
	}
	return u
}

// chargeKeyShared is the shared device whose capacity a hold of id takes,
// "" when it takes none.
func (l *ledger) chargeKeyShared(id string) string {
	if l.shared(id) {
		return id
	}
	return l.shareOf(id)
}

// admit checks that grant g by h fits beside holds, and returns the hold
// to add (ok false: h holds it already).
func (l *ledger) admit(holds map[string][]hold, g Grant, h Holder) (hold, bool, error) {
	amounts, err := l.amounts(g)
	if err != nil {
		return hold{}, false, err
	}
	shared := l.shared(g.Device)
	for _, cur := range holds[g.Device] {
		if cur.Holder == h && (!shared || cur.ShareID == g.ShareID) {
			return cur, false, nil
		}
	}
	if !shared {
		if others := holders(holds[g.Device], nil); len(others) > 0 {
			return hold{}, false, &ConflictError{Device: g.Device, Holder: others[0], Holders: others}
		}
	}
	key := l.chargeKey(g.Device)
	target := l.chargeKeyShared(g.Device)
	if target == "" && l.sharing[key] == nil {
		// A device held whole, taking no counters: nothing more to
		// judge (most devices; no walk over the holds).
		return hold{Holder: h, ShareID: g.ShareID, asked: g.Amounts}, true, nil
	}
	u := l.usage(holds, nil)
	if target != "" {
		caps := l.sharing[target].Shared
		for _, name := range sortedNames(caps) {
			c, used := caps[name], u.capacity[target][name]
			if used+amounts[name] > c.Total {
				return hold{}, false, &ConflictError{
					Device: g.Device, Holder: firstOr(l.holdersOf(holds, target)), Holders: l.holdersOf(holds, target),
					Reason: fmt.Sprintf("%s %s asked, %s of %s left", name, deviceplugin.FormatAmount(amounts[name]), deviceplugin.FormatAmount(c.Total-used), deviceplugin.FormatAmount(c.Total)),
				}
			}
		}
	}
	if s := l.sharing[key]; s != nil && !u.charged[key] {
		for _, use := range s.Consumes {
			for _, name := range sortedNames(use.Counters) {
				total, ok := l.sets[use.Set][name]
				if !ok {
					return hold{}, false, fmt.Errorf("device %q consumes counter %q of set %q, which the plugin does not list (a plugin bug: CounterSets and Describe disagree)", g.Device, name, use.Set)
				}
				used := u.counters[use.Set][name]
				if used+use.Counters[name] > total {
					by := l.setHolders(holds, use.Set)
					return hold{}, false, &ConflictError{
						Device: g.Device, Holder: firstOr(by), Holders: by,
						Reason: fmt.Sprintf("it takes %s of counter %s of %s, %s of %s left", deviceplugin.FormatAmount(use.Counters[name]), name, use.Set, deviceplugin.FormatAmount(total-used), deviceplugin.FormatAmount(total)),
					}
				}
			}
		}
	}
	return hold{Holder: h, ShareID: g.ShareID, asked: g.Amounts, amounts: amounts}, true, nil
}

// holdersOf lists who holds a shared device or one of its replicas.
func (l *ledger) holdersOf(holds map[string][]hold, target string) []Holder {
	var hs []hold
	hs = append(hs, holds[target]...)
	for _, child := range l.children[target] {
		hs = append(hs, holds[child]...)
	}
	return holders(hs, nil)
}

// setHolders lists who holds devices that take from a counter set.
func (l *ledger) setHolders(holds map[string][]hold, set string) []Holder {
	var hs []hold
	for id, cur := range holds {
		s := l.sharing[l.chargeKey(id)]
		if s == nil {
			continue
		}
		for _, use := range s.Consumes {
			if use.Set == set {
				hs = append(hs, cur...)
				break
			}
		}
	}
	return holders(hs, nil)
}

// holders lists the distinct holders of hs, sorted, except skip.
func holders(hs []hold, skip *Holder) []Holder {
	var out []Holder
	for _, h := range hs {
		if (skip == nil || h.Holder != *skip) && !slices.Contains(out, h.Holder) {
			out = append(out, h.Holder)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

func firstOr(hs []Holder) Holder {
	if len(hs) == 0 {
		return Holder{}
	}
	return hs[0]
}

func sameLedger(a, b ledger) bool {
	return slices.EqualFunc(a.setList, b.setList, func(x, y deviceplugin.CounterSet) bool {
		return x.Name == y.Name && maps.Equal(x.Counters, y.Counters)
	}) && maps.EqualFunc(a.sharing, b.sharing, sameSharing)
}

func sameSharing(a, b *deviceplugin.Sharing) bool {
	return a.ShareOf == b.ShareOf && a.DRAOnly == b.DRAOnly && maps.Equal(a.ShareAmounts, b.ShareAmounts) && maps.Equal(a.Shared, b.Shared) &&
		slices.EqualFunc(a.Consumes, b.Consumes, func(x, y deviceplugin.CounterUse) bool {
			return x.Set == y.Set && maps.Equal(x.Counters, y.Counters)
		})
}

// DRADevice is a device as the DRA front publishes it.
type DRADevice struct {
	deviceplugin.Device
	// Sharing is the device's rules, nil for a device held whole.
	Sharing *deviceplugin.Sharing
	// Capacity is what is left of each shared capacity of a shared
	// device after the device plugin front's holds: what the scheduler
	// may give out in shares.
	Capacity map[string]int64
	// ChargesCounters is false when the device plugin front's holds take
	// the device's counters already (the published sets are less them),
	// so that the scheduler does not take them twice.
	ChargesCounters bool
}

// DRAView returns what the DRA front publishes so that the scheduler
// allocates only what the arbiter will admit: the devices not held
// through another front (a shared device with what is left of its
// capacities; a device plugin replica is published as its shared
// device), and the counter sets less what other fronts' holds take. The
// scheduler counts the claims' own use itself. known is false before the
// first Scan report.
func (inv *Inventory) DRAView() (devs []DRADevice, sets []deviceplugin.CounterSet, known bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	l := &inv.ledger
	other := l.usage(inv.holds, func(_ string, h hold) bool { return h.Front == FrontDRA })
	dra := l.usage(inv.holds, func(_ string, h hold) bool { return h.Front != FrontDRA })
	otherCharged := func(key string) bool { return other.charged[key] && !dra.charged[key] }
	for _, set := range l.setList {
		left := maps.Clone(set.Counters)
		for key := range other.charged {
			if !otherCharged(key) || l.sharing[key] == nil {
				continue
			}
			for _, use := range l.sharing[key].Consumes {
				if use.Set != set.Name {
					continue
				}
				for c, v := range use.Counters {
					if _, ok := left[c]; ok {
						left[c] = max(left[c]-v, 0)
					}
				}
			}
		}
		sets = append(sets, deviceplugin.CounterSet{Name: set.Name, Counters: left})
	}
	present := make(map[string]bool, len(inv.devices))
	for _, d := range inv.devices {
		present[d.ID] = true
	}
	for _, d := range inv.devices {
		if p := l.shareOf(d.ID); p != "" && present[p] {
			continue // published as its shared device
		}
		out := DRADevice{Device: d, Sharing: l.sharing[d.ID], ChargesCounters: !otherCharged(l.chargeKey(d.ID))}
		out.NUMANodes = slices.Clone(d.NUMANodes)
		if !l.shared(d.ID) {
			if slices.ContainsFunc(inv.holds[d.ID], func(h hold) bool { return h.Front != FrontDRA }) {
				continue
			}
			devs = append(devs, out)
			continue
		}
		out.Capacity = map[string]int64{}
		fits := true
		for name, c := range l.sharing[d.ID].Shared {
			left := c.Total - other.capacity[d.ID][name]
			// The API refuses a policy whose min and one step exceed the value.
			fits = fits && left >= c.Min+max(c.Step, 1)
			out.Capacity[name] = left
		}
		if fits {
			devs = append(devs, out)
		}
	}
	return devs, sets, inv.known
}
