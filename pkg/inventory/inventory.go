// Package inventory serves one device plugin's devices through two fronts
// at once: the kubelet's device plugin API (pkg/deviceplugin) and DRA
// (pkg/draplugin). It runs the plugin's Scan once for both, holds the latest
// snapshot, and arbitrates: a device held through one front is never given
// out through the other.
//
// It imports no Kubernetes API types, so the lean plugin build may link it.
package inventory

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/backoff"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// Defaults of the options.
const (
	// DefaultAllocateGrace is how long a device plugin hold from an
	// Allocate the kubelet has not listed in PodResources lasts. The
	// kubelet records a container's devices right after Allocate returns,
	// so a device still unlisted this long after is not in use: the pod's
	// admission failed after Allocate, or the pod was gone before a
	// refresh saw it.
	DefaultAllocateGrace = 5 * time.Second
	// DefaultRefreshPeriod is how often holds are refreshed from the
	// kubelet's PodResources API.
	DefaultRefreshPeriod = 10 * time.Second
)

// Inventory is the one view of a resource's devices that every front
// serves, and the arbiter between the fronts.
type Inventory struct {
	resource string
	plugin   deviceplugin.Plugin
	log      *slog.Logger
	opts     options

	mu       sync.Mutex
	devices  []deviceplugin.Device
	known    bool
	ledger   ledger
	holds    map[string][]hold // device ID -> its holds (several for a shared device)
	watchers map[chan struct{}]struct{}

	// refreshMu makes one PodResources refresh at a time, and guards
	// podResourcesDown.
	refreshMu sync.Mutex
	// podResourcesDown is the gRPC code of the failure of the last
	// PodResources List that ended (codes.OK while it answers), so that
	// the log says when the API stops answering and when it answers
	// again, not on every refresh (kubelet-less machines have none).
	podResourcesDown codes.Code
}

// hold is one holder's hold of a device: the whole device, or one share
// of a shared device (ShareID, and the amounts it takes). For device
// plugin holds, acquired is when the last Allocate named the device, and
// recorded whether the kubelet has listed it for a container since.
type hold struct {
	Holder
	ShareID  string
	asked    map[string]int64 // the grant's amounts, as asked
	amounts  map[string]int64 // what it takes, by the ledger
	acquired time.Time
	recorded bool
}

// Option configures an Inventory.
type Option func(*options)

type options struct {
	clock                  clock.WithTicker
	podResources           PodResourcesLister
	grace, refresh         time.Duration
	retryMin, retryMax     time.Duration
	podResourcesCallBudget time.Duration
	firstAnswerWait        time.Duration
}

// WithClock sets the clock that times the allocate grace, the refresh
// period and Scan's back-off. Default the real clock.
func WithClock(c clock.WithTicker) Option { return func(o *options) { o.clock = c } }

// WithPodResources sets the kubelet's PodResources API, from which device
// plugin holds are released (see Refresh). Without it they are never
// released: a device once allocated through the device plugin front is
// never offered through DRA again while the process runs.
func WithPodResources(l PodResourcesLister) Option {
	return func(o *options) { o.podResources = l }
}

// WithFirstAnswerWait sets how long DevicePluginOnlyBesideDRA's first
// report waits for PodResources to answer. Default 10 s; 0 reports at
// once when the first call fails (there is no PodResources socket yet).
func WithFirstAnswerWait(d time.Duration) Option { return func(o *options) { o.firstAnswerWait = d } }

// WithAllocateGrace sets how long a device plugin hold the kubelet never
// recorded lasts. Default DefaultAllocateGrace.
func WithAllocateGrace(d time.Duration) Option { return func(o *options) { o.grace = d } }

// WithRefreshPeriod sets how often Run refreshes holds from PodResources.
// Default DefaultRefreshPeriod.
func WithRefreshPeriod(d time.Duration) Option { return func(o *options) { o.refresh = d } }

// WithRetry bounds the back-off between failed Scans. Defaults 50ms and 5s,
// the SDK's.
func WithRetry(lo, hi time.Duration) Option {
	return func(o *options) { o.retryMin, o.retryMax = lo, hi }
}

func defaultOptions() options {
	return options{
		clock:                  clock.RealClock{},
		grace:                  DefaultAllocateGrace,
		refresh:                DefaultRefreshPeriod,
		retryMin:               50 * time.Millisecond,
		retryMax:               5 * time.Second,
		podResourcesCallBudget: 10 * time.Second,
		firstAnswerWait:        10 * time.Second,
	}
}

// New returns the inventory of resource (such as "vendor.com/gpu") whose
// devices p scans. Nothing runs until Run. A nil log discards.
func New(resource string, p deviceplugin.Plugin, log *slog.Logger, opts ...Option) *Inventory {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Inventory{
		resource: resource,
		plugin:   p,
		log:      log.With("resource", resource),
		opts:     o,
		holds:    make(map[string][]hold),
		watchers: make(map[chan struct{}]struct{}),
	}
}

// Resource returns the resource name the inventory was made for.
func (inv *Inventory) Resource() string { return inv.resource }

// Plugin returns the plugin whose devices the inventory holds.
func (inv *Inventory) Plugin() deviceplugin.Plugin { return inv.plugin }

// Run runs the plugin's Scan until ctx ends, restarting it with back-off
// when it fails, and refreshes holds from PodResources when that is set.
// It returns nil when ctx ends.
func (inv *Inventory) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	if inv.opts.podResources != nil {
		wg.Go(func() { inv.refreshLoop(ctx) })
	}
	b := backoff.Retry{Exponential: backoff.Exponential{Initial: inv.opts.retryMin, Max: inv.opts.retryMax}, Jitter: true}
	for {
		err := inv.plugin.Scan(ctx, inv.notify)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			inv.log.Debug("Scan finished; the device set is final")
			<-ctx.Done()
			return nil
		}
		wait := b.Next()
		inv.log.Error("Scan failed; retrying", "err", err, "retryIn", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-inv.opts.clock.After(wait):
		}
	}
}

func (inv *Inventory) refreshLoop(ctx context.Context) {
	t := inv.opts.clock.NewTicker(inv.opts.refresh)
	defer t.Stop()
	for {
		_ = inv.Refresh(ctx) // it logs when the API stops and starts answering
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// notify is handed to the plugin's Scan.
func (inv *Inventory) notify(devs []deviceplugin.Device) {
	devs = dedupe(devs)
	l := readLedger(inv.plugin, devs)
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.known && sameDevices(inv.devices, devs) && sameLedger(inv.ledger, l) {
		return
	}
	inv.devices, inv.known, inv.ledger = devs, true, l
	// What a hold takes follows the rules of the snapshot: holds taken
	// before the first one (a driver's checkpoint) get their amounts now.
	for id, hs := range inv.holds {
		for i := range hs {
			hs[i].amounts, _ = l.amounts(Grant{Device: id, Amounts: hs[i].asked})
		}
	}
	inv.wakeLocked()
}

// dedupe copies devs, keeping the first report of each ID, as the SDK does.
func dedupe(devs []deviceplugin.Device) []deviceplugin.Device {
	out := make([]deviceplugin.Device, 0, len(devs))
	seen := make(map[string]bool, len(devs))
	for _, d := range devs {
		if seen[d.ID] {
			continue
		}
		seen[d.ID] = true
		d.NUMANodes = slices.Clone(d.NUMANodes)
		out = append(out, d)
	}
	return out
}

func sameDevices(a, b []deviceplugin.Device) bool {
	return slices.EqualFunc(a, b, func(x, y deviceplugin.Device) bool {
		return x.ID == y.ID && x.Healthy == y.Healthy && slices.Equal(x.NUMANodes, y.NUMANodes)
	})
}

// Devices returns the latest snapshot, and whether Scan has reported one
// yet. The slice is the caller's.
func (inv *Inventory) Devices() ([]deviceplugin.Device, bool) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	out := make([]deviceplugin.Device, len(inv.devices))
	for i, d := range inv.devices {
		d.NUMANodes = slices.Clone(d.NUMANodes)
		out[i] = d
	}
	return out, inv.known
}

// Watch returns a channel that receives a value after each change of the
// devices or of the holds, and a function to call when done watching. A
// watcher slower than the changes gets one wake-up for several: it reads
// the newest state when it gets to it.
func (inv *Inventory) Watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	inv.mu.Lock()
	inv.watchers[ch] = struct{}{}
	inv.mu.Unlock()
	return ch, func() {
		inv.mu.Lock()
		delete(inv.watchers, ch)
		inv.mu.Unlock()
	}
}

func (inv *Inventory) wakeLocked() {
	for ch := range inv.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
