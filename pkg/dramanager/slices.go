package dramanager

import (
	"context"
	"time"

	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/backoff"
)

// DefaultWipingDelay is how long a DRA driver may stay unusable (no
// plugin registered and connected) before its ResourceSlices are wiped:
// the kubelet's defaultWipingDelay.
const DefaultWipingDelay = 30 * time.Second

// wipeBackoff and wipeTries are the kubelet's retry of a wipe that
// failed: 1 s doubling up to 5 min, 100 tries.
var wipeBackoff = backoff.Exponential{Initial: time.Second, Max: 5 * time.Minute}

const wipeTries = 100

// SliceWiper deletes the ResourceSlices that DRA drivers published for
// the node. The manager needs no API server; a node backed by one passes
// a wiper built on its client, which does what the kubelet does: a
// DeleteCollection of ResourceSlices with the field selector
// spec.nodeName=<node>,spec.driver=<driver> (no spec.driver for every
// driver).
type SliceWiper interface {
	// WipeResourceSlices deletes the node's ResourceSlices of driver, of
	// every driver when driver is "". Nothing to delete is success; an
	// error is retried with back-off.
	WipeResourceSlices(ctx context.Context, driver string) error
}

// pendingWipe is a wipe scheduled for a driver that became unusable;
// closing cancel drops it.
type pendingWipe struct {
	timer  clock.Timer
	at     time.Time
	cancel chan struct{}
}

func (w *pendingWipe) stop() {
	w.timer.Stop()
	close(w.cancel)
}

// syncWipeLocked is called with plugins.mu held each time what is known
// about driver's plugins changes (registration, deregistration,
// connection up or down), as the kubelet's DRAPluginManager.sync: a
// driver with a connected plugin is usable and its pending wipe is
// cancelled; one without gets a wipe WipingDelay from now, unless one is
// pending already (the first deadline holds).
func (m *Manager) syncWipeLocked(driver string) {
	if m.cfg.Slices == nil || m.ctx == nil || m.stopped {
		return
	}
	if m.usableLocked(driver) {
		if w := m.wipes[driver]; w != nil {
			w.stop()
			delete(m.wipes, driver)
			m.log.Info("DRA driver usable again, its ResourceSlices stay", "driver", driver)
		}
		return
	}
	if m.wipes[driver] != nil {
		return
	}
	w := &pendingWipe{timer: m.cfg.Clock.NewTimer(m.cfg.WipingDelay), at: m.cfg.Clock.Now().Add(m.cfg.WipingDelay), cancel: make(chan struct{})}
	if m.wipes == nil {
		m.wipes = map[string]*pendingWipe{}
	}
	m.wipes[driver] = w
	ctx := m.ctx
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		select {
		case <-w.timer.C():
			m.fireWipe(ctx, driver, w)
		case <-w.cancel:
		case <-ctx.Done():
		}
	}()
	m.log.Info("DRA driver unusable, its ResourceSlices are wiped unless it comes back", "driver", driver, "delay", m.cfg.WipingDelay)
}

// usableLocked tells whether driver has a connected plugin.
func (m *Manager) usableLocked(driver string) bool {
	for _, p := range m.plugins.store[driver] {
		if p.Connected {
			return true
		}
	}
	return false
}

// fireWipe wipes driver's ResourceSlices if w is still its pending wipe
// and the driver is still unusable.
func (m *Manager) fireWipe(ctx context.Context, driver string, w *pendingWipe) {
	m.plugins.mu.Lock()
	if m.wipes[driver] != w {
		m.plugins.mu.Unlock()
		return
	}
	delete(m.wipes, driver)
	usable := m.usableLocked(driver)
	m.plugins.mu.Unlock()
	if !usable {
		m.wipe(ctx, driver)
	}
}

// wipeAt returns when driver's slices are to be wiped, false when no
// wipe is pending.
func (m *Manager) wipeAt(driver string) (time.Time, bool) {
	m.plugins.mu.Lock()
	defer m.plugins.mu.Unlock()
	w := m.wipes[driver]
	if w == nil {
		return time.Time{}, false
	}
	return w.at, true
}

// stopWipesLocked cancels every pending wipe; Stop calls it.
func (m *Manager) stopWipesLocked() {
	for d, w := range m.wipes {
		w.stop()
		delete(m.wipes, d)
	}
}

// wipe calls the SliceWiper until it succeeds, ctx ends or it failed
// wipeTries times, waiting between tries as the kubelet does.
func (m *Manager) wipe(ctx context.Context, driver string) {
	what := driver
	if what == "" {
		what = "every driver"
	}
	for n := 1; ; n++ {
		err := m.cfg.Slices.WipeResourceSlices(ctx, driver)
		if err == nil {
			m.log.Info("Wiped the node's ResourceSlices", "driver", what)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if n >= wipeTries {
			m.log.Warn("Gave up wiping the node's ResourceSlices; delete them by hand", "driver", what, "tries", n, "err", err)
			return
		}
		d := wipeBackoff.Delay(n)
		m.log.Info("Wiping the node's ResourceSlices failed, will retry", "driver", what, "retryIn", d, "err", err)
		after := m.cfg.Clock.After(d)
		if m.onWipeRetry != nil {
			m.onWipeRetry(d)
		}
		select {
		case <-ctx.Done():
			return
		case <-after:
		}
	}
}
