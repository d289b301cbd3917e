package inventory

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/resourcename"
)

// DevicePluginOnlyBesideDRA is DevicePluginOnly for a resource whose
// devices claims of DRA driver may hold: the resource was served through
// DRA before (its config went from [dra] to [deviceplugin]), or another
// instance still serves it through DRA (a rolling update of the plugin's
// DaemonSet). Pods whose claims were prepared then keep their devices, and
// nothing else arbitrates between them and the kubelet's device manager.
//
// So Scan also leaves out what those claims hold, as the kubelet's
// PodResources API (l) lists them for its running containers: a device a
// claim names; every replica of a shared device a claim names, whatever
// share it took (the API does not say how much); and a device whose
// counters no longer fit beside them (a whole GPU while one of its
// partitions is claimed). A device comes back once no running container
// lists it. Allocate refuses a device left out (codes.FailedPrecondition,
// naming the claim).
//
// Scan reports nothing before PodResources has answered once, so the
// kubelet is never offered a claimed device. When it has not answered
// within WithFirstAnswerWait (a kubelet without the API, or none),
// Scan reports every device, logs a warning once, and goes on asking.
// It asks every refresh period (WithRefreshPeriod) and keeps what it
// last read while the API does not answer.
//
// The options that apply are WithClock, WithRefreshPeriod,
// WithFirstAnswerWait and WithRetry (the first answer's retries); log may
// be nil.
func DevicePluginOnlyBesideDRA(p deviceplugin.Plugin, driver string, l PodResourcesLister, log *slog.Logger, opts ...Option) deviceplugin.Plugin {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return withOptional(&claimGuard{plugin: p, driver: driver, lister: l, log: log.With("driver", driver), opts: o}, p)
}

// claimGuard is DevicePluginOnlyBesideDRA's plugin.
type claimGuard struct {
	plugin deviceplugin.Plugin
	driver string
	lister PodResourcesLister
	log    *slog.Logger
	opts   options

	mu       sync.Mutex
	devs     []deviceplugin.Device
	ledger   ledger
	scanned  bool
	claims   map[string][]Holder // DRA device name -> the claims the kubelet lists it for
	answered bool                // PodResources answered once, or Scan stopped waiting for it
	down     codes.Code          // the code of the last List (codes.OK while it answers)
	withheld map[string]error    // device ID -> why it is left out
}

// Scan reports the plugin's devices less what claims hold, on every change
// of either, until ctx ends. It returns the plugin's Scan error; a Scan
// that ends without one leaves the device set final and the claims still
// followed.
func (g *claimGuard) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	wake := make(chan struct{}, 1)
	poke := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	scanned := make(chan error, 1)
	wg.Go(func() {
		scanned <- g.plugin.Scan(ctx, func(devs []deviceplugin.Device) {
			devs = dedupe(devs)
			l := readLedger(g.plugin, devs) // outside mu: Describe may lock
			g.mu.Lock()
			g.devs, g.ledger, g.scanned = devs, l, true
			g.recomputeLocked()
			g.mu.Unlock()
			poke()
		})
	})
	wg.Go(func() { g.follow(ctx, poke) })
	var last []deviceplugin.Device
	sent := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-scanned:
			if err != nil {
				return err
			}
			scanned = nil // the device set is final; claims still change
			continue
		case <-wake:
		}
		out, ok := g.view()
		if ok && (!sent || !sameDevices(out, last)) {
			notify(out)
			last, sent = out, true
		}
	}
}

// view is the devices to offer, false before there is anything to say.
func (g *claimGuard) view() ([]deviceplugin.Device, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.scanned || !g.answered {
		return nil, false
	}
	out := make([]deviceplugin.Device, 0, len(g.devs))
	for _, d := range g.devs {
		if dpOnlyHides(&g.ledger, d.ID) {
			continue
		}
		if _, ok := g.withheld[d.ID]; ok {
			continue
		}
		d.NUMANodes = slices.Clone(d.NUMANodes)
		out = append(out, d)
	}
	return out, true
}

// recomputeLocked judges each device beside the claims' holds. mu is held.
func (g *claimGuard) recomputeLocked() {
	holds := map[string][]hold{}
	if len(g.claims) > 0 {
		byName := make(map[string]string, len(g.devs))
		for _, d := range g.devs {
			byName[resourcename.DRADeviceName(d.ID)] = d.ID
		}
		for _, name := range sortedNames(g.claims) {
			id, ok := byName[name]
			if !ok {
				continue
			}
			for _, h := range g.claims[name] {
				// A claim on a shared device is taken to hold all of it.
				holds[id] = append(holds[id], hold{Holder: h, amounts: g.ledger.whole(id)})
			}
		}
	}
	dp := Holder{Front: FrontDevicePlugin, Owner: DevicePluginOwner}
	withheld := map[string]error{}
	for _, d := range g.devs {
		if len(holds) == 0 {
			break
		}
		if _, _, err := g.ledger.admit(holds, Grant{Device: d.ID}, dp); err != nil {
			withheld[d.ID] = err
		}
	}
	if !slices.Equal(sortedNames(withheld), sortedNames(g.withheld)) {
		if len(withheld) > 0 {
			g.log.Info("Devices that claims hold are not offered through the device plugin API until no running container lists them",
				"devices", sortedNames(withheld), "claims", len(g.claims))
		} else if len(g.withheld) > 0 {
			g.log.Info("No claim holds a device any more; every device is offered through the device plugin API")
		}
	}
	g.withheld = withheld
}

// whole is what holding all of a device takes of its shared capacities:
// their totals; nil for a device that is not shared.
func (l *ledger) whole(id string) map[string]int64 {
	if !l.shared(id) {
		return nil
	}
	caps := l.sharing[id].Shared
	out := make(map[string]int64, len(caps))
	for name, c := range caps {
		out[name] = c.Total
	}
	return out
}

// follow reads the claims from PodResources until ctx ends: at once and
// with back-off until it first answers (at most the call budget), then
// every refresh period.
func (g *claimGuard) follow(ctx context.Context, poke func()) {
	clk := g.opts.clock
	giveUp := clk.Now().Add(g.opts.firstAnswerWait)
	retry := g.opts.retryMin
	for {
		err := g.refresh(ctx)
		if ctx.Err() != nil {
			return
		}
		wait := g.opts.refresh
		g.mu.Lock()
		first := !g.answered
		if first && (err == nil || !clk.Now().Before(giveUp)) {
			g.answered = true
			if err != nil {
				g.log.Warn("The kubelet's PodResources API did not answer, so every device is offered through the device plugin API without checking whether a claim of the driver holds it",
					"err", err, "waited", g.opts.firstAnswerWait,
					"fix", "make the kubelet's PodResources socket (in err) reachable from this process: in a pod, mount the host's /var/lib/kubelet/pod-resources")
			}
		} else if first {
			wait = retry
			retry = min(2*retry, g.opts.retryMax)
		}
		g.mu.Unlock()
		poke()
		select {
		case <-ctx.Done():
			return
		case <-clk.After(wait):
		}
	}
}

// refresh reads which devices of the driver the kubelet lists for
// running containers' claims. When the API fails, what was read before
// stays.
func (g *claimGuard) refresh(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, g.opts.podResourcesCallBudget)
	defer cancel()
	resp, err := g.lister.List(cctx, &podresourcesv1.ListPodResourcesRequest{})
	if ctx.Err() != nil {
		return ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.logAnswer(err)
	if err != nil {
		return fmt.Errorf("PodResources List: %w", err)
	}
	claims := map[string][]Holder{}
	for _, pod := range resp.GetPodResources() {
		for _, c := range pod.GetContainers() {
			for _, dr := range c.GetDynamicResources() {
				h := Holder{Front: FrontDRA, Owner: fmt.Sprintf("ResourceClaim %s/%s", dr.GetClaimNamespace(), dr.GetClaimName())}
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() != g.driver || slices.Contains(claims[cr.GetDeviceName()], h) {
						continue
					}
					claims[cr.GetDeviceName()] = append(claims[cr.GetDeviceName()], h)
				}
			}
		}
	}
	if !maps.EqualFunc(claims, g.claims, slices.Equal) || g.claims == nil {
		g.claims = claims
		g.recomputeLocked()
	}
	return nil
}

// logAnswer logs a change in how PodResources answers, after the first
// answer: a failure once, its return once. mu is held.
func (g *claimGuard) logAnswer(err error) {
	code := status.Code(err)
	was := g.down
	g.down = code
	switch {
	case code == was, !g.answered:
	case code == codes.OK:
		g.log.Info("The kubelet's PodResources API answers again; devices that claims hold follow it")
	default:
		g.log.Warn("The kubelet's PodResources API does not answer; devices that claims held when it last answered stay withheld from the device plugin API until it does; said once, and again when it answers", "err", err)
	}
}

// Allocate refuses a device a claim holds, and otherwise asks the plugin.
func (g *claimGuard) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	g.mu.Lock()
	var refused error
	for _, id := range ids {
		if err := g.withheld[id]; err != nil {
			refused = err
			break
		}
	}
	g.mu.Unlock()
	if refused != nil {
		return nil, status.Error(codes.FailedPrecondition, "device plugin Allocate refused: "+refused.Error())
	}
	return g.plugin.Allocate(ctx, ids)
}

// dpOnlyHides reports whether the device plugin API alone leaves id out:
// a shared device offered through its replicas, or a DRAOnly device.
func dpOnlyHides(l *ledger, id string) bool {
	s := l.sharing[id]
	return s != nil && (s.DRAOnly || len(s.Shared) > 0 && len(l.children[id]) > 0)
}
