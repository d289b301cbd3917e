package dramanager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"k8s.io/utils/clock"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/dpkit/dpkit/internal/fileutil"
)

// Health is a device's health as pods see it.
type Health string

// The values of Health, those of the pod API's ResourceHealthStatus.
const (
	Healthy   Health = "Healthy"
	Unhealthy Health = "Unhealthy"
	Unknown   Health = "Unknown"
)

// maxDevicesPerDriver caps the health entries kept per driver: reports are
// not checked against ResourceSlices, so a driver inventing names would
// otherwise grow the cache without bound (the kubelet's cap).
const maxDevicesPerDriver = 16384

// DeviceHealth is the last report about one device. Its JSON form is the
// kubelet's dra_health_state entry.
type DeviceHealth struct {
	PoolName           string
	DeviceName         string
	Health             Health
	LastUpdated        time.Time
	HealthCheckTimeout time.Duration
	Message            string
}

type driverHealth struct {
	Devices map[string]DeviceHealth
}

// healthCache holds the last report of every device, per driver, and
// writes it to Root/dra_health_state on every change as the kubelet does.
type healthCache struct {
	mu      sync.RWMutex
	drivers map[string]driverHealth
	path    string
}

func loadHealth(path string) (*healthCache, error) {
	c := &healthCache{drivers: map[string]driverHealth{}, path: path}
	blob, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return c, nil
	}
	if err == nil {
		err = json.Unmarshal(blob, &c.drivers)
	}
	if err != nil {
		// The kubelet starts with an empty cache then: health is only a
		// view, the next reports rebuild it.
		return &healthCache{drivers: map[string]driverHealth{}, path: path}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

func (c *healthCache) saveLocked() error {
	blob, err := json.Marshal(c.drivers)
	if err != nil {
		return err
	}
	return fileutil.WriteCheckpoint(c.path, blob, 0o600)
}

// get returns a device's health at now: Unknown when nothing was reported
// or the last report is older than its timeout.
func (c *healthCache) get(driver, pool, device string, now time.Time, def time.Duration) DeviceHealth {
	res := DeviceHealth{PoolName: pool, DeviceName: device, Health: Unknown}
	c.mu.RLock()
	defer c.mu.RUnlock()
	d, ok := c.drivers[driver].Devices[pool+"/"+device]
	if !ok {
		return res
	}
	timeout := d.HealthCheckTimeout
	if timeout == 0 {
		timeout = def
	}
	if now.Sub(d.LastUpdated) > timeout {
		return res
	}
	return d
}

// update merges a full report from driver at now and returns the devices
// whose health, message or timeout changed, including devices missing
// from the report whose last report timed out (they turn Unknown and are
// dropped).
func (c *healthCache) update(driver string, devices []DeviceHealth, now time.Time, def time.Duration) ([]DeviceHealth, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cur, ok := c.drivers[driver]
	if !ok {
		cur = driverHealth{Devices: map[string]DeviceHealth{}}
		c.drivers[driver] = cur
	}
	var changed []DeviceHealth
	reported := make(map[string]bool, len(devices))
	for _, d := range devices {
		d.LastUpdated = now
		key := d.PoolName + "/" + d.DeviceName
		reported[key] = true
		old, known := cur.Devices[key]
		if !known && len(cur.Devices) >= maxDevicesPerDriver {
			continue
		}
		if !known || old.Health != d.Health || old.Message != d.Message || old.HealthCheckTimeout != d.HealthCheckTimeout {
			changed = append(changed, d)
		}
		cur.Devices[key] = d
	}
	deleted := false
	for key, d := range cur.Devices {
		if reported[key] {
			continue
		}
		timeout := d.HealthCheckTimeout
		if timeout == 0 {
			timeout = def
		}
		if now.Sub(d.LastUpdated) > timeout {
			if d.Health != Unknown {
				d.Health, d.Message, d.LastUpdated = Unknown, "", now
				changed = append(changed, d)
			}
			delete(cur.Devices, key)
			deleted = true
		}
	}
	if len(changed) > 0 || deleted {
		return changed, c.saveLocked()
	}
	return changed, nil
}

// expire marks Unknown every device whose last report is older than its
// timeout at now, and returns them by driver, with the earliest time at
// which another device's report times out (zero when none will). A
// device marked Unknown keeps its last report's time; the next report
// about it is a change (update), so its pods hear of it again.
func (c *healthCache) expire(now time.Time, def time.Duration) (map[string][]DeviceHealth, time.Time, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next time.Time
	expired := map[string][]DeviceHealth{}
	for driver, dh := range c.drivers {
		for key, d := range dh.Devices {
			if d.Health == Unknown {
				continue
			}
			timeout := d.HealthCheckTimeout
			if timeout == 0 {
				timeout = def
			}
			// get: Unknown once now.Sub(LastUpdated) > timeout.
			at := d.LastUpdated.Add(timeout).Add(time.Nanosecond)
			if !now.Before(at) {
				d.Health, d.Message = Unknown, ""
				dh.Devices[key] = d
				expired[driver] = append(expired[driver], d)
				continue
			}
			if next.IsZero() || at.Before(next) {
				next = at
			}
		}
	}
	if len(expired) > 0 {
		return expired, next, c.saveLocked()
	}
	return nil, next, nil
}

// clear forgets a driver's devices (its stream ended: all Unknown) and
// returns the ones that were known.
func (c *healthCache) clear(driver string) ([]DeviceHealth, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var gone []DeviceHealth
	for _, d := range c.drivers[driver].Devices {
		gone = append(gone, d)
	}
	delete(c.drivers, driver)
	return gone, c.saveLocked()
}

// startTimers arms the health expiry (armHealth) and, with ActivePods
// set, the reconciliation every ReconcilePeriod. Both run on timers: no
// goroutine waits for them (one fewer for each of the thousand nodes of
// a process). stopTimers ends them.
func (m *Manager) startTimers(ctx context.Context) {
	m.timersMu.Lock()
	m.timersCtx = ctx
	if m.cfg.ActivePods != nil {
		m.reconcileTimer = m.after(m.cfg.ReconcilePeriod, m.reconcileTick)
	}
	m.timersMu.Unlock()
	m.armHealth()
}

// stopTimers stops the timers; a callback already running finishes
// before Stop returns (m.wg), and none starts work after it.
func (m *Manager) stopTimers() {
	m.timersMu.Lock()
	defer m.timersMu.Unlock()
	m.timersStopped = true
	for _, t := range []clock.Timer{m.reconcileTimer, m.healthTimer} {
		if t != nil {
			t.Stop()
		}
	}
	m.afterMu.Lock()
	m.afterStopped = true
	m.afterMu.Unlock()
}

// after runs f on a goroutine of its own d from now, counted in m.wg,
// unless the timers stopped. The goroutine lives only while f runs: a
// clock may call its timers' functions holding a lock of its own
// (k8s.io/utils' fake clock does), which f, asking the clock the time,
// would wait for.
func (m *Manager) after(d time.Duration, f func()) clock.Timer {
	return m.cfg.Clock.AfterFunc(d, func() {
		m.afterMu.Lock()
		defer m.afterMu.Unlock()
		if m.afterStopped {
			return
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			f()
		}()
	})
}

// reconcileTick starts a reconciliation (startReconcile) and arms the
// next.
func (m *Manager) reconcileTick() {
	m.timersMu.Lock()
	defer m.timersMu.Unlock()
	if m.timersStopped || m.timersCtx.Err() != nil {
		return
	}
	m.startReconcile(m.timersCtx)
	m.reconcileTimer = m.after(m.cfg.ReconcilePeriod, m.reconcileTick)
}

// armHealth tells the pods whose devices' last reports timed out, and
// arms the timer for the earliest expiry to come: a driver that stops
// reporting without closing its stream makes its devices Unknown in the
// pods' status at the time they time out, without waiting for another
// change. It runs at the start, on that timer and after every report.
func (m *Manager) armHealth() {
	m.timersMu.Lock()
	defer m.timersMu.Unlock()
	if m.timersStopped || m.timersCtx == nil || m.timersCtx.Err() != nil {
		return
	}
	expired, next, err := m.health.expire(m.cfg.Clock.Now(), m.cfg.HealthTimeout)
	if err != nil {
		m.log.Error("Saving the DRA health state failed", "err", err)
	}
	for _, driver := range sortedKeys(expired) {
		m.log.Info("DRA driver stopped reporting the health of devices, now Unknown", "driver", driver, "devices", len(expired[driver]))
		m.notify(driver, expired[driver])
	}
	if m.healthTimer != nil {
		m.healthTimer.Stop()
		m.healthTimer = nil
	}
	if !next.IsZero() {
		m.healthTimer = m.after(next.Sub(m.cfg.Clock.Now()), m.armHealth)
	}
	if m.onHealthTimer != nil {
		m.onHealthTimer(next)
	}
}

// watchHealth keeps p's health stream open until ctx ends: it reopens it
// HealthRetryPeriod after it ended, and stops for good when the driver
// answers Unimplemented (it advertised the service but serves no health;
// a driver that gains it registers again).
func (m *Manager) watchHealth(ctx context.Context, p *plugin) {
	log := m.log.With("driver", p.Driver, "endpoint", p.Endpoint)
	for {
		stream, err := p.watchResources(ctx)
		if err == nil {
			err = m.handleHealthStream(stream, p.Driver)
		}
		if ctx.Err() != nil {
			return
		}
		if unimplemented(err) {
			log.Info("DRA driver serves no health, not watching it", "err", err)
			return
		}
		log.Debug("DRA health stream ended, retrying", "err", err, "retryIn", m.cfg.HealthRetryPeriod)
		select {
		case <-ctx.Done():
			return
		case <-m.cfg.Clock.After(m.cfg.HealthRetryPeriod):
		}
	}
}

// handleHealthStream reads reports until the stream ends; then the
// driver's devices are forgotten (Unknown) and their pods told.
func (m *Manager) handleHealthStream(stream drahealthv1.DRAResourceHealth_NodeWatchResourcesClient, driver string) error {
	defer func() {
		gone, err := m.health.clear(driver)
		if err != nil {
			m.log.Error("Saving the DRA health state failed", "driver", driver, "err", err)
		}
		m.notify(driver, gone)
	}()
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		devices := make([]DeviceHealth, 0, len(resp.GetDevices()))
		for _, d := range resp.GetDevices() {
			devices = append(devices, m.deviceHealth(d))
		}
		changed, err := m.health.update(driver, devices, m.cfg.Clock.Now(), m.cfg.HealthTimeout)
		if err != nil {
			m.log.Error("Saving the DRA health state failed", "driver", driver, "err", err)
		}
		m.armHealth()
		m.notify(driver, changed)
		if m.onHealth != nil {
			m.onHealth(driver)
		}
	}
}

func (m *Manager) deviceHealth(d *drahealthv1.DeviceHealth) DeviceHealth {
	timeout := m.cfg.HealthTimeout
	if s := d.GetHealthCheckTimeoutSeconds(); s > 0 {
		timeout = time.Duration(s) * time.Second
	}
	h := Unknown
	switch d.GetHealth() {
	case drahealthv1.HealthStatus_HEALTHY:
		h = Healthy
	case drahealthv1.HealthStatus_UNHEALTHY:
		h = Unhealthy
	}
	msg := d.GetMessage()
	if len(msg) > corev1.ResourceHealthMessageMaxLength {
		msg = msg[:corev1.ResourceHealthMessageMaxLength-3] + "..."
	}
	return DeviceHealth{
		PoolName:           d.GetDevice().GetPoolName(),
		DeviceName:         d.GetDevice().GetDeviceName(),
		Health:             h,
		LastUpdated:        time.Unix(d.GetLastUpdatedTime(), 0),
		HealthCheckTimeout: timeout,
		Message:            msg,
	}
}

// notify sends the UIDs of the pods using any of devices of driver on
// Updates, with those of an update still unread.
func (m *Manager) notify(driver string, devices []DeviceHealth) {
	if len(devices) == 0 {
		return
	}
	type key struct{ pool, device string }
	changed := make(map[key]bool, len(devices))
	for _, d := range devices {
		changed[key{d.PoolName, d.DeviceName}] = true
	}
	pods := map[types.UID]bool{}
	m.cache.mu.RLock()
	for _, c := range m.cache.claims {
		for _, d := range c.DriverState[driver].Devices {
			if changed[key{d.PoolName, d.DeviceName}] {
				for uid := range c.PodUIDs {
					pods[types.UID(uid)] = true
				}
			}
		}
	}
	m.cache.mu.RUnlock()
	if len(pods) == 0 {
		return
	}
	// One update waits at most: an update not yet read takes these pods
	// too, so none is ever dropped (the kubelet's channel holds 100 and
	// drops what does not fit).
	m.updatesMu.Lock()
	defer m.updatesMu.Unlock()
	select {
	case prev := <-m.updates:
		for _, u := range prev {
			pods[u] = true
		}
	default:
	}
	uids := make([]types.UID, 0, len(pods))
	for u := range pods {
		uids = append(uids, u)
	}
	slices.Sort(uids)
	m.updates <- uids // emptied above, and only senders hold updatesMu
	if f := m.onUpdate.Load(); f != nil {
		(*f)()
	}
}

// OnUpdate has f called after every update sent on Updates, so that its
// reader need not wait on the channel: f must only take note and return
// (ondemand.Loop.Ensure, say); the reader then takes the update without
// blocking. nil stops it.
func (m *Manager) OnUpdate(f func()) {
	if f == nil {
		m.onUpdate.Store(nil)
		return
	}
	m.onUpdate.Store(&f)
}

// Updates delivers the UIDs of pods whose devices' health changed, sorted;
// the caller recomputes their status with UpdateAllocatedResourcesStatus.
// Changes that come before the caller reads are delivered together.
func (m *Manager) Updates() <-chan []types.UID { return m.updates }

// DeviceHealth returns what is known of a device's health now: Unknown
// when its driver reported nothing or its last report timed out.
func (m *Manager) DeviceHealth(driver, pool, device string) DeviceHealth {
	return m.health.get(driver, pool, device, m.cfg.Clock.Now(), m.cfg.HealthTimeout)
}
