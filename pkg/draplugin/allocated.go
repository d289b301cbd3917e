package draplugin

import (
	"context"
	"log/slog"
	"slices"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// AllocatedClaims follows the ResourceClaims the scheduler allocated, for
// the drivers of one process: one informer over every claim, indexed by
// driver and pool, whose events are handed to the driver of the pool
// only, so a thousand drivers in one process (dpkit node --count 1000)
// are not each told of every claim. It runs while a driver follows it
// (Config.Allocated), and stops with the last.
//
// It needs list and watch of resourceclaims, cluster-wide. Refused, it
// says so once at warning level, with the fix, and its drivers go on
// without it, holding devices from Prepare on as before.
type AllocatedClaims struct {
	client kubernetes.Interface
	log    *slog.Logger

	mu       sync.Mutex
	informer cache.SharedIndexInformer
	stop     context.CancelFunc
	subs     map[string]map[*subscription]bool // driver/pool -> who follows it
	refused  bool
}

type subscription struct{ kick func() }

// poolIndex is the informer's index of claims by the driver/pool of
// their allocation's results.
const poolIndex = "dpkit.io/driver-pool"

// NewAllocatedClaims follows claims through client; log may be nil.
func NewAllocatedClaims(client kubernetes.Interface, log *slog.Logger) *AllocatedClaims {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &AllocatedClaims{client: client, log: log, subs: map[string]map[*subscription]bool{}}
}

// poolsOf are the driver/pool keys of claim's allocation, each once.
func poolsOf(obj any) []string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	c, ok := obj.(*resourcev1.ResourceClaim)
	if !ok || c.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		k := poolKey(r.Driver, r.Pool)
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

func poolKey(driver, pool string) string { return driver + "/" + pool }

// subscribe has kick called after every change of a claim allocated from
// driver's pool (or no longer), until the returned function is called. The
// first subscription starts the informer.
func (a *AllocatedClaims) subscribe(driver, pool string, kick func()) func() {
	s := &subscription{kick: kick}
	key := poolKey(driver, pool)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.subs[key] == nil {
		a.subs[key] = map[*subscription]bool{}
	}
	a.subs[key][s] = true
	if a.informer == nil && !a.refused {
		a.startLocked()
	}
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.subs[key], s)
		if len(a.subs[key]) == 0 {
			delete(a.subs, key)
		}
		if len(a.subs) == 0 && a.stop != nil {
			a.stop()
			a.informer, a.stop = nil, nil
		}
	}
}

// startLocked starts a new informer (a stopped one cannot start again).
// mu is held.
func (a *AllocatedClaims) startLocked() {
	ctx, cancel := context.WithCancel(context.Background())
	f := informers.NewSharedInformerFactory(a.client, 0)
	inf := f.Resource().V1().ResourceClaims().Informer()
	if err := inf.AddIndexers(cache.Indexers{poolIndex: func(obj any) ([]string, error) { return poolsOf(obj), nil }}); err != nil {
		cancel()
		a.log.Warn("Cannot index ResourceClaims by pool; devices are held from Prepare on only", "err", err)
		a.refused = true
		return
	}
	_ = inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		if !apierrors.IsForbidden(err) {
			cache.DefaultWatchErrorHandler(ctx, r, err)
			return
		}
		a.mu.Lock()
		first := !a.refused
		a.refused = true
		a.mu.Unlock()
		if first {
			a.log.Warn("Cannot list and watch ResourceClaims, so devices that the scheduler allocated to claims are still offered through the device plugin API until the claims are prepared",
				"err", err, "fix", "grant the plugin's service account list and watch of resource.k8s.io resourceclaims (deploy/simulator's ClusterRole does; the plugin DaemonSets' do not, since their DRA fronts do not follow allocations)")
		}
		cancel()
	})
	handler := func(objs ...any) {
		var keys []string
		for _, o := range objs {
			for _, k := range poolsOf(o) {
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		a.mu.Lock()
		var kicks []func()
		for _, k := range keys {
			for s := range a.subs[k] {
				kicks = append(kicks, s.kick)
			}
		}
		a.mu.Unlock()
		for _, kick := range kicks {
			kick()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { handler(obj) },
		UpdateFunc: func(oldObj, newObj any) { handler(oldObj, newObj) },
		DeleteFunc: func(obj any) { handler(obj) },
	}); err != nil {
		cancel()
		return
	}
	a.informer, a.stop = inf, cancel
	go inf.RunWithContext(ctx)
}

// allocated returns the claims allocated from driver's pool, and whether
// the informer has listed them all once (before that, a claim missing
// from the answer may still be allocated).
func (a *AllocatedClaims) allocated(driver, pool string) ([]*resourcev1.ResourceClaim, bool) {
	a.mu.Lock()
	inf := a.informer
	a.mu.Unlock()
	if inf == nil || !inf.HasSynced() {
		return nil, false
	}
	objs, err := inf.GetIndexer().ByIndex(poolIndex, poolKey(driver, pool))
	if err != nil {
		return nil, false
	}
	out := make([]*resourcev1.ResourceClaim, 0, len(objs))
	for _, o := range objs {
		if c, ok := o.(*resourcev1.ResourceClaim); ok {
			out = append(out, c)
		}
	}
	return out, true
}
