package dramanager

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// wiper records the wipes it is asked for; the first fail errors fail.
type wiper struct {
	mu    sync.Mutex
	fail  int
	calls chan string
}

func newWiper(fail int) *wiper { return &wiper{fail: fail, calls: make(chan string, 100)} }

func (w *wiper) WipeResourceSlices(_ context.Context, driver string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fail > 0 {
		w.fail--
		w.calls <- "failed " + driver
		return errors.New("API server unavailable")
	}
	w.calls <- driver
	return nil
}

func (w *wiper) next(t *testing.T) string {
	t.Helper()
	select {
	case d := <-w.calls:
		return d
	case <-time.After(time.Minute):
		t.Fatal("no wipe within a minute")
		return ""
	}
}

func (w *wiper) none(t *testing.T, when string) {
	t.Helper()
	select {
	case d := <-w.calls:
		t.Fatalf("%s: wipe %q, want none", when, d)
	default:
	}
}

// waitConnected waits until the manager lists want plugins of which up
// are connected.
func (n *node) waitConnected(t *testing.T, want, up int) {
	t.Helper()
	for {
		ch := n.m.PluginsChanged()
		ps := n.m.Plugins()
		c := 0
		for _, p := range ps {
			if p.Connected {
				c++
			}
		}
		if len(ps) == want && c == up {
			return
		}
		<-ch
	}
}

// TestResourceSlicesWiped follows the kubelet's DRAPluginManager: every
// driver's slices are wiped at start; a driver that unregisters (clean
// stop) or whose connection is lost (crash) has its slices wiped
// WipingDelay later, not a moment sooner, unless it is usable again
// before (the delay then counts from its next stop); the delay is the clock's, the kubelet's 30 s by default.
func TestResourceSlicesWiped(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	w := newWiper(0)
	n := newNode(t, "", func(c *Config) { c.Clock = clk; c.Slices = w })
	if n.m.cfg.WipingDelay != 30*time.Second {
		t.Fatalf("default WipingDelay %v, want 30s", n.m.cfg.WipingDelay)
	}
	if d := w.next(t); d != "" {
		t.Fatalf("first wipe %q, want every driver's at start", d)
	}

	// Stopped and back within the delay: nothing wiped.
	d := n.startDriver(t)
	n.waitConnected(t, 1, 1)
	n.noWipe(t, "driver connected")
	d.Stop()
	n.waitConnected(t, 0, 0)
	n.wipeAt(t, "driver stopped", clk.Now().Add(DefaultWipingDelay))
	clk.Step(DefaultWipingDelay - time.Second)
	d = n.startDriver(t)
	n.waitConnected(t, 1, 1)
	n.noWipe(t, "driver back within the delay")

	// Stopped again: the delay counts from this stop.
	d.Stop()
	n.waitConnected(t, 0, 0)
	n.wipeAt(t, "driver stopped again", clk.Now().Add(DefaultWipingDelay))
	clk.Step(DefaultWipingDelay - time.Nanosecond)
	w.none(t, "1ns before the delay")
	clk.Step(time.Nanosecond)
	if got := w.next(t); got != driverName {
		t.Fatalf("wipe %q, want %q", got, driverName)
	}

	// Killed (its registration stays, the connection is lost): wiped
	// after the delay too.
	d = n.startDriver(t)
	n.waitConnected(t, 1, 1)
	d.Kill()
	n.waitConnected(t, 1, 0)
	n.wipeAt(t, "driver killed", clk.Now().Add(DefaultWipingDelay))
	clk.Step(DefaultWipingDelay - time.Nanosecond)
	w.none(t, "killed, 1ns before the delay")
	clk.Step(time.Nanosecond)
	if got := w.next(t); got != driverName {
		t.Fatalf("wipe after a crash %q, want %q", got, driverName)
	}
}

// TestResourceSlicesWipeRetried: a wipe that fails is tried again after
// the kubelet's back-off (1 s, then 2 s), on the manager's clock.
func TestResourceSlicesWipeRetried(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	w := newWiper(2)
	m, err := New(Config{Root: t.TempDir(), Clock: clk, Slices: w})
	if err != nil {
		t.Fatal(err)
	}
	waits := make(chan time.Duration, 10)
	m.onWipeRetry = func(d time.Duration) { waits <- d }
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		if got := w.next(t); got != "failed " {
			t.Fatalf("try %d: %q, want a failed wipe of every driver", i+1, got)
		}
		if d := <-waits; d != want {
			t.Fatalf("try %d: waits %v, want %v", i+1, d, want)
		}
		clk.Step(want - time.Nanosecond)
		w.none(t, "before the back-off")
		clk.Step(time.Nanosecond)
	}
	if got := w.next(t); got != "" {
		t.Fatalf("third try %q, want success", got)
	}
}

func (n *node) noWipe(t *testing.T, when string) {
	t.Helper()
	if at, ok := n.m.wipeAt(driverName); ok {
		t.Fatalf("%s: wipe pending at %v, want none", when, at)
	}
}

func (n *node) wipeAt(t *testing.T, when string, want time.Time) {
	t.Helper()
	if at, ok := n.m.wipeAt(driverName); !ok || !at.Equal(want) {
		t.Fatalf("%s: wipe pending %v at %v, want at %v", when, ok, at, want)
	}
}
