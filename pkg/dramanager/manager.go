// Package dramanager is the kubelet's DRA manager for a dpkit node: it
// registers DRA drivers found by the plugin watcher (plugin type
// DRAPlugin), prepares the ResourceClaims of a pod before it runs by
// calling the drivers' NodePrepareResources, unprepares them when the pod
// is gone, keeps what it prepared in the kubelet's checkpoint
// (Root/dra_manager_state, package checkpoint) and follows the drivers'
// device health (NodeWatchResources). It answers the PodResources API's
// questions about dynamic resources (GetDynamicResources) and gives a
// container its CDI devices (CDIDevices).
//
// The ResourceClaims come from the caller through a ClaimGetter, so the
// manager needs no API server: a node backed by one passes a client,
// tests a map. The manager does not publish ResourceSlices (drivers do);
// it decides when they are wiped, as the kubelet does, and a SliceWiper
// its user passes deletes them (Config.Slices).
//
// It follows the v1.37 kubelet (pkg/kubelet/cm/dra) step by step:
//
//   - Registration: GetInfo's versions list gRPC service names; the first
//     DRAPlugin service of the driver's list the manager speaks (v1, then
//     v1beta1) is used, and the newest health service both speak
//     (v1.DRAResourceHealth, then v1alpha1). A second registration on an
//     endpoint already registered for the driver is refused; a second
//     endpoint for a driver is a rolling update: both stay registered
//     and calls go to the newest connected one.
//   - PrepareResources validates everything first (claims fetched,
//     owned, reserved for the pod, allocated, drivers registered) and
//     changes nothing when that fails, so a pod that cannot start can be
//     deleted without Unprepare calls. It then checkpoints "pod references
//     claim" before calling any driver, calls NodePrepareResources once
//     per driver with all its claims (CallTimeout each), and checkpoints
//     the devices the drivers returned.
//   - UnprepareResources calls NodeUnprepareResources only for claims no
//     other pod uses, once per driver, and forgets them after success.
//     Reconcile does it for pods that are no longer active.
//   - Health: a device is Unknown when its driver has not reported it
//     within its timeout (HealthTimeout by default) or its stream ended;
//     a timer at the earliest expiry tells its pods (Updates).
//   - ResourceSlices: with a SliceWiper, every driver's are wiped at
//     Start and a driver's once it stayed unusable for WipingDelay.
//   - Metrics: the kubelet's dra_* metrics, with a Registerer.
//
// Deliberate differences are listed in docs/dra.md.
package dramanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/pkg/dramanager/checkpoint"
)

// Manager is the DRA manager of one node. Create it with New, Start it,
// and Stop it when done.
type Manager struct {
	cfg     Config
	log     *slog.Logger
	cache   claimCache
	health  *healthCache
	plugins plugins
	// updates holds one update at most; updatesMu orders its senders.
	updates   chan []types.UID
	updatesMu sync.Mutex
	onUpdate  atomic.Pointer[func()] // OnUpdate's
	// reconciling is set while a reconciliation runs (startReconcile).
	reconciling atomic.Bool
	// pluginsChanged is broadcast when Plugins' answer may have changed.
	pluginsChanged broadcast.Change
	metrics        *metrics
	// timersMu guards the timers (startTimers) and what their callbacks
	// start.
	timersMu       sync.Mutex
	timersCtx      context.Context
	timersStopped  bool
	reconcileTimer clock.Timer
	healthTimer    clock.Timer
	// afterMu orders the timers' goroutines (after) before Stop's wait.
	afterMu      sync.Mutex
	afterStopped bool
	// onHealthTimer, set by tests before Start, is called each time the
	// health expiry timer is armed, with the time it fires (zero: none).
	onHealthTimer func(next time.Time)
	// onHealth, set by tests before Start, is called after every report.
	onHealth func(driver string)
	// onWipeRetry, set by tests before Start, is called once a failed
	// wipe waits d on the clock.
	onWipeRetry func(d time.Duration)
	// wipes are the pending ResourceSlice wipes by driver, guarded by
	// plugins.mu.
	wipes map[string]*pendingWipe

	// ctx, cancel and stopped are guarded by plugins.mu.
	ctx     context.Context
	cancel  context.CancelFunc
	stopped bool
	wg      sync.WaitGroup
}

// New validates cfg, applies defaults and restores the claims of the
// checkpoint. A checkpoint that cannot be read is an error naming the
// file: the claims it lists may still be prepared, and forgetting them
// would leak devices (the kubelet refuses to start too).
func New(cfg Config) (*Manager, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("dramanager: invalid config: %w", err)
	}
	m := &Manager{
		cfg:     cfg,
		log:     cfg.Logger,
		cache:   claimCache{claims: map[string]*claimInfo{}, path: filepath.Join(cfg.Root, checkpoint.FileName)},
		updates: make(chan []types.UID, 1),
	}
	mt, err := newMetrics(cfg.Registerer, m)
	if err != nil {
		return nil, fmt.Errorf("dramanager: %w", err)
	}
	m.metrics = mt
	list, err := checkpoint.Read(m.cache.path)
	switch {
	case errors.Is(err, checkpoint.ErrNotFound):
		// The kubelet's checkpointer creates the file at once (GetOrCreate),
		// empty, and refuses to start when it cannot.
		if err := os.MkdirAll(cfg.Root, 0o750); err != nil {
			return nil, fmt.Errorf("dramanager: %w; Root must be a directory the manager can write", err)
		}
		if err := checkpoint.Write(m.cache.path, nil); err != nil {
			return nil, fmt.Errorf("dramanager: %w; Root must be a directory the manager can write", err)
		}
	case err != nil:
		return nil, fmt.Errorf("dramanager: %w; the claims it lists may still be prepared: unprepare them (drain the node) and remove the file to start afresh", err)
	}
	for _, c := range list {
		m.cache.claims[claimKey(c.Namespace, c.ClaimName)] = &claimInfo{ClaimState: c}
	}
	m.health, err = loadHealth(filepath.Join(cfg.Root, HealthStateFile))
	if err != nil {
		m.log.Warn("Device health state unreadable, starting with none", "err", err)
	}
	if len(list) > 0 {
		m.log.Info("Restored DRA claims from the checkpoint", "claims", len(list))
	}
	return m, nil
}

// Start lets drivers register and, when Config.ActivePods is set, runs
// the reconcile loop until ctx ends or Stop is called. Start may be
// called once.
func (m *Manager) Start(ctx context.Context) error {
	m.plugins.mu.Lock()
	defer m.plugins.mu.Unlock()
	if m.ctx != nil || m.stopped {
		return errors.New("dramanager: already started or stopped")
	}
	m.ctx, m.cancel = context.WithCancel(ctx)
	if m.cfg.Slices != nil {
		// No driver has registered yet: the slices of an earlier run
		// go, as the kubelet wipes them at start.
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.wipe(m.ctx, "")
		}()
	}
	m.startTimers(m.ctx)
	return nil
}

// startReconcile unprepares, in a goroutine of its own, the claims of the
// pods no longer active, unless the last round still runs: the calls to
// the drivers take as long as the drivers do, and the health expiry
// that starts it must not wait for them.
func (m *Manager) startReconcile(ctx context.Context) {
	if !m.reconciling.CompareAndSwap(false, true) {
		return
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer m.reconciling.Store(false)
		pods := m.cfg.ActivePods()
		active := make([]types.UID, 0, len(pods))
		for _, p := range pods {
			active = append(active, p.UID)
		}
		if err := m.Reconcile(ctx, active); err != nil {
			m.log.Info("Unpreparing the claims of inactive pods failed, will retry", "err", err)
		}
	}()
}

// Stop ends what Start started, closes the drivers' connections and
// waits for the manager's goroutines. It may be called any number of
// times, with or without Start.
func (m *Manager) Stop() {
	m.plugins.mu.Lock()
	m.stopped = true
	m.stopWipesLocked()
	cancel := m.cancel
	m.plugins.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	m.stopTimers()
	m.closePlugins()
	m.wg.Wait()
}

// Reconcile unprepares the claims of every pod the cache references that
// is not in active. It returns the errors of the pods it could not
// finish; they are retried on the next call.
func (m *Manager) Reconcile(ctx context.Context, active []types.UID) error {
	keep := make(map[string]bool, len(active))
	for _, u := range active {
		keep[string(u)] = true
	}
	type podClaims struct {
		namespace string
		names     []string
	}
	gone := map[types.UID]*podClaims{}
	m.cache.mu.RLock()
	for _, ci := range m.cache.claims {
		for uid := range ci.PodUIDs {
			if keep[uid] {
				continue
			}
			pc := gone[types.UID(uid)]
			if pc == nil {
				pc = &podClaims{namespace: ci.Namespace}
				gone[types.UID(uid)] = pc
			}
			pc.names = append(pc.names, ci.ClaimName)
		}
	}
	m.cache.mu.RUnlock()
	var errs []error
	for uid, pc := range gone {
		if err := m.unprepare(ctx, uid, pc.namespace, pc.names); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", uid, err))
		}
	}
	return errors.Join(errs...)
}

// prepareItem is one claim of a pod through PrepareResources.
type prepareItem struct {
	claim   *resourcev1.ResourceClaim
	info    *claimInfo
	plugins map[string]*plugin
}

// PrepareResources prepares every claim of pod (see the package doc for
// the steps). It is idempotent: claims already prepared are not sent to
// their drivers again. Errors do not name the pod, as the kubelet's: they
// show up in its context (an event on it).
func (m *Manager) PrepareResources(ctx context.Context, pod *corev1.Pod) error {
	start := m.cfg.Clock.Now()
	err := m.prepare(ctx, pod)
	m.metrics.observeOperation("PrepareResources", start, m.cfg.Clock.Now(), err)
	if err != nil {
		return fmt.Errorf("prepare dynamic resources: %w", err)
	}
	return nil
}

func (m *Manager) prepare(ctx context.Context, pod *corev1.Pod) error {
	claims, err := podClaims(pod)
	if err != nil {
		return err
	}
	if len(claims) == 0 {
		return nil
	}
	if m.cfg.Claims == nil {
		return errors.New("this node has no source of ResourceClaims (dramanager.Config.Claims): it cannot run pods with claims")
	}
	// Validate without touching the cache: a pod that fails here leaves
	// nothing to unprepare, even when its driver never comes.
	items := make([]prepareItem, 0, len(claims))
	for _, pc := range claims {
		claim, err := m.cfg.Claims.GetResourceClaim(ctx, pod.Namespace, pc.name)
		if err != nil {
			return fmt.Errorf("fetch ResourceClaim %s: %w", pc.name, err)
		}
		if err := checkClaimForPod(pod, claim, pc.mustCheckOwner); err != nil {
			return err
		}
		info, err := newClaimInfo(claim)
		if err != nil {
			return fmt.Errorf("ResourceClaim %s: %w", claim.Name, err)
		}
		it := prepareItem{claim: claim, info: info, plugins: map[string]*plugin{}}
		for driver := range info.DriverState {
			p, err := m.getPlugin(driver)
			if err != nil {
				return err
			}
			it.plugins[driver] = p
		}
		items = append(items, it)
	}

	batches := map[*plugin][]*drav1.Claim{}
	var order []*plugin
	err = func() error {
		m.cache.mu.Lock()
		defer m.cache.mu.Unlock()
		for _, it := range items {
			ci, ok := m.cache.get(it.claim.Namespace, it.claim.Name)
			if !ok {
				ci = it.info
				m.cache.claims[claimKey(ci.Namespace, ci.ClaimName)] = ci
			} else {
				if ci.ClaimUID != string(it.claim.UID) {
					return fmt.Errorf("old ResourceClaim with same name %s and different UID %s still exists (previous pod force-deleted?!)", it.claim.Name, ci.ClaimUID)
				}
				if ci.unpreparing {
					return fmt.Errorf("ResourceClaim %s is being unprepared", it.claim.Name)
				}
			}
			ci.PodUIDs[string(pod.UID)] = struct{}{}
			// Checkpoint before any driver call: if the pod goes away
			// before its claims are prepared, Reconcile finds them.
			if err := m.cache.syncLocked(); err != nil {
				return fmt.Errorf("checkpoint ResourceClaim cache: %w", err)
			}
			if ci.prepared {
				continue
			}
			claim := &drav1.Claim{Namespace: ci.Namespace, Uid: ci.ClaimUID, Name: ci.ClaimName}
			for _, driver := range sortedKeys(ci.DriverState) {
				p := it.plugins[driver]
				if _, ok := batches[p]; !ok {
					order = append(order, p)
				}
				batches[p] = append(batches[p], claim)
			}
		}
		return nil
	}()
	if err != nil {
		return err
	}

	names := map[string]string{} // claim UID -> name, of the claims sent
	for _, p := range order {
		claims := batches[p]
		for _, c := range claims {
			names[c.Uid] = c.Name
		}
		resp, err := p.prepare(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims})
		if err != nil {
			return fmt.Errorf("NodePrepareResources: %w", err)
		}
		for uid, res := range resp.GetClaims() {
			name, ok := names[uid]
			if !ok || !inBatch(claims, uid) {
				return fmt.Errorf("NodePrepareResources returned result for unknown claim UID %s", uid)
			}
			if res.GetError() != "" {
				return fmt.Errorf("NodePrepareResources failed for ResourceClaim %s: %s", name, res.GetError())
			}
			m.cache.mu.Lock()
			ci, ok := m.cache.get(pod.Namespace, name)
			if ok {
				// The driver's answer is authoritative for its part of
				// the claim: a retry after a partial failure replaces.
				ds := ci.DriverState[p.Driver]
				ds.Devices = nil
				for _, d := range res.GetDevices() {
					ds.Devices = append(ds.Devices, checkpoint.Device{
						PoolName: d.GetPoolName(), DeviceName: d.GetDeviceName(), ShareID: d.ShareId,
						RequestNames: d.GetRequestNames(), CDIDeviceIDs: d.GetCdiDeviceIds(),
					})
				}
				// Copy on write: readers take the claim's state under
				// the lock and read its map after releasing it.
				states := maps.Clone(ci.DriverState)
				states[p.Driver] = ds
				ci.DriverState = states
			}
			m.cache.mu.Unlock()
			if !ok {
				return fmt.Errorf("internal error: unable to get claim info for ResourceClaim %s in namespace %s", name, pod.Namespace)
			}
		}
		if n := len(claims) - len(resp.GetClaims()); n != 0 {
			return fmt.Errorf("NodePrepareResources skipped %d ResourceClaims", n)
		}
	}

	m.cache.mu.Lock()
	defer m.cache.mu.Unlock()
	for _, it := range items {
		if ci, ok := m.cache.get(it.claim.Namespace, it.claim.Name); ok {
			ci.prepared = true
		}
	}
	if err := m.cache.syncLocked(); err != nil {
		return fmt.Errorf("checkpoint ResourceClaim state: %w", err)
	}
	return nil
}

func inBatch(claims []*drav1.Claim, uid string) bool {
	for _, c := range claims {
		if c.Uid == uid {
			return true
		}
	}
	return false
}

// UnprepareResources unprepares the claims of pod that no other pod
// uses. It is idempotent. The pod's claims are those the cache records
// for it, or, when it records none (a checkpoint removed), those of its
// spec and status.
func (m *Manager) UnprepareResources(ctx context.Context, pod *corev1.Pod) error {
	start := m.cfg.Clock.Now()
	err := m.unprepareForPod(ctx, pod)
	m.metrics.observeOperation("UnprepareResources", start, m.cfg.Clock.Now(), err)
	if err != nil {
		return fmt.Errorf("unprepare dynamic resources: %w", err)
	}
	return nil
}

func (m *Manager) unprepareForPod(ctx context.Context, pod *corev1.Pod) error {
	m.cache.mu.RLock()
	names := m.cache.namesForPod(pod.UID)
	m.cache.mu.RUnlock()
	if len(names) == 0 {
		claims, err := podClaims(pod)
		if err != nil {
			return err
		}
		for _, c := range claims {
			names = append(names, c.name)
		}
	}
	return m.unprepare(ctx, pod.UID, pod.Namespace, names)
}

func (m *Manager) unprepare(ctx context.Context, podUID types.UID, namespace string, names []string) error {
	batches := map[string][]*drav1.Claim{}
	var drivers []string
	done := map[string]bool{} // claim names to forget after success
	m.cache.mu.Lock()
	for _, name := range names {
		ci, ok := m.cache.get(namespace, name)
		if !ok || !ci.PodUIDs.Has(string(podUID)) {
			// Not known, or never referenced by this pod: PrepareResources
			// adds the reference before any driver call, so there is
			// nothing to undo, and the claim may be another pod's.
			continue
		}
		if len(ci.PodUIDs) > 1 {
			// Still used: drop the reference; it is checkpointed below,
			// and a restart before that only repeats this idempotent step.
			delete(ci.PodUIDs, string(podUID))
			continue
		}
		ci.unpreparing = true
		done[name] = true
		claim := &drav1.Claim{Namespace: ci.Namespace, Uid: ci.ClaimUID, Name: ci.ClaimName}
		for _, d := range sortedKeys(ci.DriverState) {
			if _, ok := batches[d]; !ok {
				drivers = append(drivers, d)
			}
			batches[d] = append(batches[d], claim)
		}
	}
	m.cache.mu.Unlock()

	for _, d := range drivers {
		claims := batches[d]
		p, err := m.getPlugin(d)
		if err != nil {
			return err
		}
		resp, err := p.unprepare(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims})
		if err != nil {
			return fmt.Errorf("NodeUnprepareResources: %w", err)
		}
		for uid, res := range resp.GetClaims() {
			c := lookup(claims, uid)
			if c == nil {
				return fmt.Errorf("NodeUnprepareResources returned result for unknown claim UID %s", uid)
			}
			if res.GetError() != "" {
				return fmt.Errorf("NodeUnprepareResources failed for ResourceClaim %s: %s", c.Name, res.GetError())
			}
		}
		if n := len(claims) - len(resp.GetClaims()); n != 0 {
			return fmt.Errorf("NodeUnprepareResources skipped %d ResourceClaims", n)
		}
	}

	m.cache.mu.Lock()
	defer m.cache.mu.Unlock()
	for name := range done {
		delete(m.cache.claims, claimKey(namespace, name))
	}
	if err := m.cache.syncLocked(); err != nil {
		return fmt.Errorf("checkpoint ResourceClaim state: %w", err)
	}
	return nil
}

func lookup(claims []*drav1.Claim, uid string) *drav1.Claim {
	for _, c := range claims {
		if c.Uid == uid {
			return c
		}
	}
	return nil
}

// PodMightNeedToUnprepareResources tells whether the cache references
// the pod: until it does not, the pod's claims are not all unprepared.
func (m *Manager) PodMightNeedToUnprepareResources(uid types.UID) bool {
	m.cache.mu.RLock()
	defer m.cache.mu.RUnlock()
	for _, ci := range m.cache.claims {
		if ci.PodUIDs.Has(string(uid)) {
			return true
		}
	}
	return false
}

// Claims returns the claims the manager knows, as checkpointed.
func (m *Manager) Claims() []checkpoint.ClaimState {
	m.cache.mu.RLock()
	defer m.cache.mu.RUnlock()
	out := make([]checkpoint.ClaimState, 0, len(m.cache.claims))
	for _, k := range sortedKeys(m.cache.claims) {
		out = append(out, m.cache.claims[k].ClaimState)
	}
	return out
}

// CDIDevices returns the CDI device IDs container gets from the claims it
// uses, what the kubelet passes to the container runtime. A claim not
// prepared is an error.
func (m *Manager) CDIDevices(pod *corev1.Pod, c *corev1.Container) ([]string, error) {
	uses, order, err := containerClaims(pod, c)
	if err != nil {
		return nil, err
	}
	m.cache.mu.RLock()
	defer m.cache.mu.RUnlock()
	var out []string
	for _, name := range order {
		ci, ok := m.cache.get(pod.Namespace, name)
		if !ok {
			return nil, fmt.Errorf("ResourceClaim %s is not prepared on this node", name)
		}
		for _, req := range uses[name] {
			out = append(out, ci.cdiDevices(req)...)
		}
	}
	return out, nil
}
