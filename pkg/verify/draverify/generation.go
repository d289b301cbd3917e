package draverify

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/dpkit/dpkit/pkg/verify"
)

// What dra.slices.generation holds a driver to is what the upstream
// ResourceSlice controller (k8s.io/dynamic-resource-allocation/
// resourceslice, Controller.syncPool) does, no more. Each time it
// publishes a pool it takes the newest generation among the pool's
// slices and keeps it when the change is at most one update of one
// existing slice and creates none (obsolete slices are deleted first);
// otherwise it bumps the generation, or takes the driver's when that is
// higher, and writes every slice with it. Updates are conditional on
// the resourceVersion, and a pool's desired slices never list a device
// twice (validatePool). So whatever the driver publishes, the controller
// never
//
//   - writes a slice with a generation below the newest of its pool's
//     slices (the generation going backwards);
//   - creates a slice in a generation the pool was already complete in;
//   - leaves a generation the pool was complete in with slices that
//     disagree on resourceSliceCount, or that list one device twice
//     (what changing two slices in place, one after the other, shows).
//
// It does change one slice of a pool in place without a new generation,
// in a pool of one slice or of many, and at another publication another
// one: verify accepts that, since the upstream controller does it.

// settleQuiet is how long a driver's slices must stay unwritten before
// verify takes them as published.
const settleQuiet = time.Second

// sliceState is one version of a ResourceSlice as the watch saw it.
type sliceState struct {
	driver, pool string
	gen, count   int64
	devices      string   // spec.devices as JSON
	names        []string // the devices' names
	rv           string
}

type poolKey struct{ driver, pool string }

// sliceFinding is what the watch concluded from one write of a slice:
// a change of devices (good) or a write the upstream controller never
// makes (bad).
type sliceFinding struct {
	driver string
	bad    bool
	text   string
}

// sliceWatch records every version of the ResourceSlices for the run's
// node during the run, so that each write can be judged against the
// pool's generation whenever it happens: verify cannot make a driver's
// devices change, but sees it when they do (health, hot-plug, a
// restart).
type sliceWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	node   *corev1.Node

	mu       sync.Mutex
	live     map[string]sliceState // slice name -> last version
	complete map[poolKey]int64     // the generation each pool was last seen complete in
	found    []sliceFinding
	written  map[string]time.Time // driver -> when its slices were last written
	err      error
}

// watchSlices starts watching the ResourceSlices for the run's node
// (nodeslices.go: by any node selection, so all of them are watched and
// the others dropped).
func (r *run) watchSlices(ctx context.Context) error {
	w, err := r.client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sw := &sliceWatch{cancel: cancel, done: make(chan struct{}), node: r.nodeObject(ctx),
		live: map[string]sliceState{}, complete: map[poolKey]int64{}, written: map[string]time.Time{}}
	go func() {
		defer close(sw.done)
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if !ok {
					sw.mu.Lock()
					sw.err = fmt.Errorf("the watch of ResourceSlices ended")
					sw.mu.Unlock()
					return
				}
				if s, ok := ev.Object.(*resourcev1.ResourceSlice); ok {
					sw.record(ev.Type, s, time.Now())
				}
			}
		}
	}()
	r.slices = sw
	return nil
}

func (sw *sliceWatch) stateOf(s *resourcev1.ResourceSlice) sliceState {
	devs, _ := json.Marshal(s.Spec.Devices)
	st := sliceState{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, gen: s.Spec.Pool.Generation, count: s.Spec.Pool.ResourceSliceCount, devices: string(devs), rv: s.ResourceVersion}
	for _, d := range s.Spec.Devices {
		st.names = append(st.names, d.Name)
	}
	return st
}

// newestLocked is the newest generation of pk among the live slices and
// the slices in it; -1 when there are none.
func (sw *sliceWatch) newestLocked(pk poolKey) (int64, []string) {
	gen := int64(-1)
	var in []string
	for name, st := range sw.live {
		switch {
		case st.driver != pk.driver || st.pool != pk.pool:
		case st.gen > gen:
			gen, in = st.gen, []string{name}
		case st.gen == gen:
			in = append(in, name)
		}
	}
	sort.Strings(in)
	return gen, in
}

func (sw *sliceWatch) record(typ watch.EventType, s *resourcev1.ResourceSlice, at time.Time) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	old, seen := sw.live[s.Name]
	relevant := sliceForNode(s, sw.node) || len(s.Spec.SharedCounters) > 0
	if (typ != watch.Added && typ != watch.Modified) || !relevant {
		if seen && typ != watch.Bookmark {
			delete(sw.live, s.Name)
			sw.written[old.driver] = at
			// A pool whose slices are all gone is no pool: it may come
			// back in any generation.
			if gen, _ := sw.newestLocked(poolKey{old.driver, old.pool}); gen < 0 {
				delete(sw.complete, poolKey{old.driver, old.pool})
			}
		}
		return
	}
	now := sw.stateOf(s)
	if seen && old.rv == now.rv {
		return
	}
	sw.written[now.driver] = at
	pk := poolKey{now.driver, now.pool}
	newest, _ := sw.newestLocked(pk)
	completeIn, wasComplete := sw.complete[pk]
	add := func(bad bool, format string, args ...any) {
		sw.found = append(sw.found, sliceFinding{now.driver, bad, fmt.Sprintf(format, args...)})
	}
	switch {
	case now.gen < newest:
		add(true, "%s was written with generation %d, below generation %d of pool %s: the generation went backwards", s.Name, now.gen, newest, now.pool)
	case !seen && wasComplete && now.gen == completeIn:
		add(true, "%s was created in generation %d of pool %s, which was complete: a new slice needs a new generation", s.Name, now.gen, now.pool)
	case seen && old.devices != now.devices && old.gen == now.gen:
		add(false, "%s changed its devices in place in generation %d", s.Name, now.gen)
	case seen && old.devices != now.devices:
		add(false, "%s changed its devices with generation %d to %d", s.Name, old.gen, now.gen)
	}
	sw.live[s.Name] = now
	gen, in := sw.newestLocked(pk)
	problem := sw.poolProblemLocked(in)
	if wasComplete && gen == completeIn && now.gen == gen && problem != "" {
		add(true, "after %s was written, pool %s, complete in generation %d before, %s: a change of more than one slice needs a new generation", s.Name, now.pool, gen, problem)
	}
	if problem == "" && int64(len(in)) == sw.live[in[0]].count {
		sw.complete[pk] = gen
	}
}

// poolProblemLocked says what is wrong with the slices in of one
// generation of a pool: counts that disagree or a device listed twice;
// "" when nothing is.
func (sw *sliceWatch) poolProblemLocked(in []string) string {
	counts := map[int64]bool{}
	seen := map[string]string{}
	for _, name := range in {
		st := sw.live[name]
		counts[st.count] = true
		for _, d := range st.names {
			if other, ok := seen[d]; ok && other != name {
				return fmt.Sprintf("lists device %s in both %s and %s", d, other, name)
			}
			seen[d] = name
		}
	}
	if len(counts) > 1 {
		return fmt.Sprintf("has slices that disagree on resourceSliceCount (%s)", strings.Join(in, ", "))
	}
	return ""
}

func (sw *sliceWatch) stop() {
	sw.cancel()
	<-sw.done
}

// settle waits, up to twice --call-timeout, until the driver's slices
// have not been written for settleQuiet, and it is settleQuiet past
// since: a check then judges slices that the driver is done publishing,
// not the ones it is about to replace (after a restart the old slices
// are still there).
func (r *run) settle(ctx context.Context, since time.Time) {
	if r.slices == nil {
		return
	}
	// A watch that has not seen the driver's writes yet would call it
	// quiet: a driver that writes a second pool a moment after the first
	// was judged with half of it.
	r.catchUp(ctx)
	deadline := time.Now().Add(2 * r.cfg.CallTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		r.slices.mu.Lock()
		last := since
		if w := r.slices.written[r.driver]; w.After(last) {
			last = w
		}
		r.slices.mu.Unlock()
		if time.Since(last) >= settleQuiet {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// catchUp waits, up to --call-timeout, until the watch has seen the
// driver's slices as a list of them has them now.
func (r *run) catchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	sl, err := r.slicesNow(ctx)
	if err != nil {
		return
	}
	want := map[string]string{}
	for _, s := range sl {
		want[s.Name] = s.ResourceVersion
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		r.slices.mu.Lock()
		ok := true
		for name, st := range r.slices.live {
			if st.driver == r.driver && want[name] != st.rv {
				ok = false
			}
		}
		for name := range want {
			if _, seen := r.slices.live[name]; !seen {
				ok = false
			}
		}
		r.slices.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// checkGeneration judges what the slice watch saw of the driver's slices.
func (r *run) checkGeneration(ctx context.Context) {
	if r.slices == nil {
		r.set(verify.CheckDRAGeneration, verify.Skip, "the ResourceSlices could not be watched")
		return
	}
	r.catchUp(ctx)
	r.slices.stop()
	sw := r.slices
	sw.mu.Lock()
	defer sw.mu.Unlock()
	var bad, changes []string
	for _, f := range sw.found {
		switch {
		case f.driver != r.driver:
		case f.bad:
			bad = append(bad, f.text)
		default:
			changes = append(changes, f.text)
		}
	}
	switch {
	case len(bad) > 0:
		r.set(verify.CheckDRAGeneration, verify.Fail, "%s", strings.Join(slices.Compact(bad), "; "))
	case len(changes) > 0:
		r.set(verify.CheckDRAGeneration, verify.Pass, "the devices changed %d time(s), each a write the upstream ResourceSlice controller makes: %s", len(changes), strings.Join(changes, "; "))
	case sw.err != nil:
		r.set(verify.CheckDRAGeneration, verify.Skip, "%v before the devices changed", sw.err)
	default:
		r.set(verify.CheckDRAGeneration, verify.Skip, "the devices of pool %s did not change during the run (verify cannot make a driver's devices change; a change of health or a restart that changes attributes shows here)", r.pool)
	}
}
