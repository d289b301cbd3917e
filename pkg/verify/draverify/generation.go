package draverify

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/dpkit/dpkit/pkg/verify"
)

// sliceState is one version of a ResourceSlice as the watch saw it.
type sliceState struct {
	driver, pool string
	gen          int64
	devices      string // spec.devices as JSON
}

// sliceChange is a change of a slice's devices.
type sliceChange struct{ driver, text string }

// sliceWatch records every version of the node's ResourceSlices during
// the run, so that a change of devices can be checked against the pool's
// generation whenever it happens: verify cannot make a driver's devices
// change, but sees it when they do (health, hot-plug, a restart).
type sliceWatch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	last    map[string]sliceState // slice name -> last version
	changes []sliceChange         // changes with a new generation
	bad     []sliceChange         // changes within one generation
	err     error
}

// watchSlices starts watching the ResourceSlices of the run's node.
func (r *run) watchSlices(ctx context.Context) error {
	w, err := r.client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + r.node})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	sw := &sliceWatch{cancel: cancel, done: make(chan struct{}), last: map[string]sliceState{}}
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
				if s, ok := ev.Object.(*resourcev1.ResourceSlice); ok && (ev.Type == watch.Added || ev.Type == watch.Modified) {
					sw.record(s)
				}
			}
		}
	}()
	r.slices = sw
	return nil
}

func (sw *sliceWatch) record(s *resourcev1.ResourceSlice) {
	devs, _ := json.Marshal(s.Spec.Devices)
	now := sliceState{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, gen: s.Spec.Pool.Generation, devices: string(devs)}
	sw.mu.Lock()
	defer sw.mu.Unlock()
	old, seen := sw.last[s.Name]
	sw.last[s.Name] = now
	if !seen || old.devices == now.devices || old.driver != now.driver || old.pool != now.pool {
		return
	}
	switch {
	case now.gen == old.gen:
		sw.bad = append(sw.bad, sliceChange{now.driver, fmt.Sprintf("%s (pool %s) changed its devices and kept generation %d", s.Name, now.pool, now.gen)})
	case now.gen > old.gen:
		sw.changes = append(sw.changes, sliceChange{now.driver, fmt.Sprintf("%s: generation %d to %d", s.Name, old.gen, now.gen)})
	}
}

func (sw *sliceWatch) stop() {
	sw.cancel()
	<-sw.done
}

// checkGeneration judges what the slice watch saw of the driver's slices.
func (r *run) checkGeneration() {
	if r.slices == nil {
		r.set(verify.CheckDRAGeneration, verify.Skip, "the ResourceSlices could not be watched")
		return
	}
	r.slices.stop()
	sw := r.slices
	sw.mu.Lock()
	defer sw.mu.Unlock()
	mine := func(l []sliceChange) []string {
		var out []string
		for _, c := range l {
			if c.driver == r.driver {
				out = append(out, c.text)
			}
		}
		return out
	}
	bad, changes := mine(sw.bad), mine(sw.changes)
	switch {
	case len(bad) > 0:
		r.set(verify.CheckDRAGeneration, verify.Fail, "%s", strings.Join(bad, "; "))
	case len(changes) > 0:
		r.set(verify.CheckDRAGeneration, verify.Pass, "the devices changed %d time(s), each with a new generation: %s", len(changes), strings.Join(changes, "; "))
	case sw.err != nil:
		r.set(verify.CheckDRAGeneration, verify.Skip, "%v before the devices changed", sw.err)
	default:
		r.set(verify.CheckDRAGeneration, verify.Skip, "the devices of pool %s did not change during the run (verify cannot make a driver's devices change; a change of health or a restart that changes attributes shows here)", r.pool)
	}
}
