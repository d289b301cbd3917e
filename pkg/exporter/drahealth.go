package exporter

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/unixsock"
)

// DRASocketName is the socket a DRA driver serves the kubelet on, in its
// directory of the kubelet's plugins directory: <plugins>/<driver>/dra.sock
// (the upstream kubeletplugin helper's default, and dpkit's DRA front's).
const DRASocketName = "dra.sock"

// DefaultDRAHealthTimeout is how long a device's health, as its driver
// last reported it, holds when the report sets no timeout: the kubelet's
// default (30 s). After it the health is Unknown, as the kubelet says.
const DefaultDRAHealthTimeout = 30 * time.Second

// DefaultDRAHealthMaxDevices is how many devices of one driver a
// DRAHealth keeps the health of when DRAHealthConfig.MaxDevicesPerDriver
// is 0: far more than a node has, few enough that a driver (or whatever
// serves its socket) reporting made-up device names cannot grow the
// exporter's memory without limit.
const DefaultDRAHealthMaxDevices = 4096

// maxDRANameLen is the longest pool or device name a DRAHealth keeps;
// longer ones (and empty ones) are skipped. The API allows pool names of
// a few DNS subdomains and device names of one DNS label, far shorter.
const maxDRANameLen = 1024

// DRAHealthConfig configures a DRAHealth.
type DRAHealthConfig struct {
	// PluginsDir is the kubelet's plugins directory
	// (/var/lib/kubelet/plugins); driver D is read on
	// PluginsDir/D/dra.sock. Required.
	PluginsDir string
	// Logger; logs are discarded when nil.
	Logger *slog.Logger
	// Clock; the real clock when nil.
	Clock clock.PassiveClock
	// MaxDevicesPerDriver bounds the devices of one driver whose health
	// is kept; a report of one more forgets the device reported longest
	// ago. 0 means DefaultDRAHealthMaxDevices.
	MaxDevicesPerDriver int
}

// Validate reports every problem of c.
func (c *DRAHealthConfig) Validate() error {
	var errs []error
	if c.PluginsDir == "" {
		errs = append(errs, errors.New("pluginsDir: the kubelet's plugins directory is required (/var/lib/kubelet/plugins)"))
	}
	if c.MaxDevicesPerDriver < 0 {
		errs = append(errs, fmt.Errorf("maxDevicesPerDriver: %d is negative; set a positive bound, or 0 for the default (%d)", c.MaxDevicesPerDriver, DefaultDRAHealthMaxDevices))
	}
	return errors.Join(errs...)
}

// DRAHealth is a HealthSource of DRA devices read straight from their
// drivers' health streams (DRAResourceHealth.NodeWatchResources, the
// stream the kubelet reads to fill the pod status), with no API server.
// It watches a driver from the first time it is asked about one of its
// devices until Close, and reconnects when the driver serves its socket
// again. A device's health is what the driver last said of it, Unknown
// once that is older than the report's timeout (DefaultDRAHealthTimeout
// when it sets none) or while the driver's stream is broken, and not
// known ("") for a driver that does not report health (Unimplemented) or
// has not reported the device. It keeps at most MaxDevicesPerDriver
// devices of a driver, those reported last.
//
// Each stream runs the driver's health reporting once more: dpkit's DRA
// front and drivers on the upstream kubeletplugin helper serve any number
// of streams, each with every report; a driver that hands each report to
// only one stream would split them between the kubelet and the exporter.
type DRAHealth struct {
	cfg    DRAHealthConfig
	log    *slog.Logger
	clock  clock.PassiveClock
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	drivers map[string]*driverHealth
}

// driverHealth is what a driver reported: devices finds a device's
// entry in order, which holds the entries from the one reported last
// (front) to the one reported longest ago (back), the one a report of a
// device beyond the bound evicts.
type driverHealth struct {
	conn    *grpc.ClientConn
	devices map[string]*list.Element // pool/device -> *deviceHealth in order
	order   *list.List
}

type deviceHealth struct {
	key     string // pool/device
	health  string
	at      time.Time
	timeout time.Duration
}

func newDriverHealth(conn *grpc.ClientConn) *driverHealth {
	return &driverHealth{conn: conn, devices: map[string]*list.Element{}, order: list.New()}
}

// put records v as the device's latest report, evicting the entries
// reported longest ago while there are more than maxDevices; it returns
// how many it evicted.
func (dh *driverHealth) put(v deviceHealth, maxDevices int) (evicted int) {
	if e, ok := dh.devices[v.key]; ok {
		*e.Value.(*deviceHealth) = v
		dh.order.MoveToFront(e)
		return 0
	}
	dh.devices[v.key] = dh.order.PushFront(&v)
	for dh.order.Len() > maxDevices {
		oldest := dh.order.Back()
		dh.order.Remove(oldest)
		delete(dh.devices, oldest.Value.(*deviceHealth).key)
		evicted++
	}
	return evicted
}

// get returns the device's latest report.
func (dh *driverHealth) get(key string) (deviceHealth, bool) {
	e, ok := dh.devices[key]
	if !ok {
		return deviceHealth{}, false
	}
	return *e.Value.(*deviceHealth), true
}

// NewDRAHealth returns a DRAHealth for cfg. Close stops its watches.
func NewDRAHealth(cfg DRAHealthConfig) (*DRAHealth, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.MaxDevicesPerDriver == 0 {
		cfg.MaxDevicesPerDriver = DefaultDRAHealthMaxDevices
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &DRAHealth{cfg: cfg, log: cfg.Logger, clock: cfg.Clock, ctx: ctx, cancel: cancel, drivers: map[string]*driverHealth{}}, nil
}

// Close stops every watch and waits for them to end.
func (h *DRAHealth) Close() error {
	h.cancel()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for _, d := range h.drivers {
		errs = append(errs, d.conn.Close())
	}
	return errors.Join(errs...)
}

// Health implements HealthSource: the health of the DRA devices among
// devices, by Device.ID. A driver asked about for the first time is
// watched from now on; its devices' health is known from its first
// report.
func (h *DRAHealth) Health(_ context.Context, devices []Device) (map[string]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx.Err() != nil {
		return nil, errors.New("the DRA health source is closed")
	}
	now := h.clock.Now()
	out := map[string]string{}
	var errs []error
	for _, d := range devices {
		if !d.DRA() {
			continue
		}
		dh, ok := h.drivers[d.Driver]
		if !ok {
			var err error
			if dh, err = h.watch(d.Driver); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		v, ok := dh.get(d.Pool + "/" + d.Name)
		if !ok {
			continue
		}
		if v.health != Unknown && now.Sub(v.at) > v.timeout {
			v.health = Unknown
		}
		out[d.ID] = v.health
	}
	return out, errors.Join(errs...)
}

// watch starts watching driver; h.mu is held.
func (h *DRAHealth) watch(driver string) (*driverHealth, error) {
	if driver == "." || driver == ".." || filepath.Base(driver) != driver {
		return nil, fmt.Errorf("DRA driver %q: not a directory name under %s", driver, h.cfg.PluginsDir)
	}
	socket := filepath.Join(h.cfg.PluginsDir, driver, DRASocketName)
	conn, err := unixsock.NewGRPCClient(socket, unixsock.QuickReconnect(DefaultTimeout))
	if err != nil {
		return nil, fmt.Errorf("DRA driver %s: %w", driver, err)
	}
	dh := newDriverHealth(conn)
	h.drivers[driver] = dh
	h.wg.Go(func() { h.run(driver, socket, dh) })
	return dh, nil
}

// run reads driver's health stream until h is closed or the driver says
// it does not report health. A broken stream is opened again once the
// driver serves its socket, after a back-off that grows while streams
// end without a report.
func (h *DRAHealth) run(driver, socket string, dh *driverHealth) {
	client := drahealthv1.NewDRAResourceHealthClient(dh.conn)
	log := h.log.With("driver", driver, "socket", socket)
	const minDelay, maxDelay = 100 * time.Millisecond, 5 * time.Second
	delay := minDelay
	for {
		got, err := h.stream(client, driver, log)
		if h.ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		now := h.clock.Now()
		for e := dh.order.Front(); e != nil; e = e.Next() {
			v := e.Value.(*deviceHealth)
			v.health, v.at = Unknown, now
		}
		if status.Code(err) == codes.Unimplemented {
			dh.devices, dh.order = map[string]*list.Element{}, list.New() // and none ever again
		}
		h.mu.Unlock()
		if status.Code(err) == codes.Unimplemented {
			log.Info("The DRA driver does not report device health", "err", err)
			return
		}
		log.Warn("The DRA driver's health stream ended; its devices are Unknown until it reports again", "err", err)
		if got {
			delay = minDelay
		}
		t := time.NewTimer(delay)
		select {
		case <-h.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, maxDelay)
	}
}

// stream reads one health stream of driver to its end; got tells whether
// it delivered a report. The first report of the stream that evicts
// devices or has names that are skipped is logged; later ones are not, so
// that a driver that reports too much cannot flood the log either.
func (h *DRAHealth) stream(client drahealthv1.DRAResourceHealthClient, driver string, log *slog.Logger) (got bool, err error) {
	s, err := client.NodeWatchResources(h.ctx, &drahealthv1.NodeWatchResourcesRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return false, err
	}
	warned := false
	for {
		resp, err := s.Recv()
		if err != nil {
			return got, err
		}
		got = true
		evicted, skipped := h.record(driver, resp)
		if (evicted > 0 || skipped > 0) && !warned {
			warned = true
			log.Warn("The DRA driver reports more devices than the exporter keeps, or unusable names: the devices reported longest ago are forgotten and those names skipped; logged once per stream",
				"maxDevicesPerDriver", h.cfg.MaxDevicesPerDriver, "evicted", evicted, "skipped", skipped, "maxNameBytes", maxDRANameLen)
		}
	}
}

// record keeps the health resp reports of driver's devices; it returns
// how many devices it evicted to stay within the bound and how many
// entries it skipped for their names.
func (h *DRAHealth) record(driver string, resp *drahealthv1.NodeWatchResourcesResponse) (evicted, skipped int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	dh := h.drivers[driver]
	now := h.clock.Now()
	for _, d := range resp.GetDevices() {
		pool, name := d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName()
		if pool == "" || name == "" || len(pool) > maxDRANameLen || len(name) > maxDRANameLen {
			skipped++
			continue
		}
		timeout := time.Duration(d.GetHealthCheckTimeoutSeconds()) * time.Second
		if timeout <= 0 {
			timeout = DefaultDRAHealthTimeout
		}
		evicted += dh.put(deviceHealth{
			key: pool + "/" + name, health: draHealthName(d.GetHealth()), at: now, timeout: timeout,
		}, h.cfg.MaxDevicesPerDriver)
	}
	return evicted, skipped
}

func draHealthName(s drahealthv1.HealthStatus) string {
	switch s {
	case drahealthv1.HealthStatus_HEALTHY:
		return Healthy
	case drahealthv1.HealthStatus_UNHEALTHY:
		return Unhealthy
	default:
		return Unknown
	}
}
