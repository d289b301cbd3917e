package exporter

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/syncbuf"
)

// healthDriver serves DRAResourceHealth on a DRA driver's socket: each
// stream sends what the test puts on reports; opened tells each stream's
// start.
type healthDriver struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
	reports       chan *drahealthv1.NodeWatchResourcesResponse
	opened        chan struct{}
	unimplemented bool
}

func (d *healthDriver) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s drahealthv1.DRAResourceHealth_NodeWatchResourcesServer) error {
	d.opened <- struct{}{}
	if d.unimplemented {
		return status.Error(codes.Unimplemented, "no health")
	}
	for {
		select {
		case r := <-d.reports:
			if err := s.Send(r); err != nil {
				return err
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

// serveDriver serves d as driver under pluginsDir until the returned stop
// is called (or the test ends).
func serveDriver(t testing.TB, pluginsDir, driver string, d *healthDriver) (stop func()) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(pluginsDir, driver), 0o750); err != nil {
		t.Fatal(err)
	}
	l, err := podresourcesListen(filepath.Join(pluginsDir, driver, DRASocketName))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	drahealthv1.RegisterDRAResourceHealthServer(srv, d)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(l) }()
	stop = func() { srv.Stop(); <-done }
	t.Cleanup(stop)
	return stop
}

func report(pool, device string, h drahealthv1.HealthStatus, timeoutSeconds int64) *drahealthv1.NodeWatchResourcesResponse {
	return &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{{
		Device: &drahealthv1.DeviceIdentifier{PoolName: pool, DeviceName: device}, Health: h, HealthCheckTimeoutSeconds: timeoutSeconds,
	}}}
}

// healthBecomes waits until h says want of d: the report the test's
// driver sent is read on the stream's goroutine. It gives up after a
// minute, so that a health that never comes fails with a message.
func healthBecomes(t testing.TB, h HealthSource, d Device, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	var got map[string]string
	for {
		var err error
		got, err = h.Health(t.Context(), []Device{d})
		if err != nil {
			t.Fatal(err)
		}
		if got[d.ID] == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("health of %s %q, want %q", d.ID, got[d.ID], want)
		case <-tick.C:
		}
	}
}

// TestDRAHealth reads device health from a DRA driver's health stream
// with no API server: a device is known from the driver's first report;
// a change shows; a report older than its timeout is Unknown; a driver
// gone makes its devices Unknown, and back on its socket it is read
// again; a driver that does not report health (Unimplemented) gives
// none; device plugin devices are not asked about; and the exporter
// serves the health of a DRA device the pod status does not list.
func TestDRAHealth(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	drv := &healthDriver{reports: make(chan *drahealthv1.NodeWatchResourcesResponse), opened: make(chan struct{}, 10)}
	stop := serveDriver(t, dir, "fake.dpkit.io", drv)
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	h, err := NewDRAHealth(DRAHealthConfig{PluginsDir: dir, Clock: fc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	dev := Device{Driver: "fake.dpkit.io", Pool: "node-1", Name: "dev-0", ID: "fake.dpkit.io/node-1/dev-0"}
	dp := Device{Resource: "example.com/gpu", ID: "gpu0"}

	got, err := h.Health(t.Context(), []Device{dev, dp})
	if err != nil || len(got) != 0 {
		t.Fatalf("before the driver reported: %v, %v; want nothing", got, err)
	}
	<-drv.opened
	drv.reports <- report("node-1", "dev-0", drahealthv1.HealthStatus_HEALTHY, 10)
	healthBecomes(t, h, dev, Healthy)
	drv.reports <- report("node-1", "dev-0", drahealthv1.HealthStatus_UNHEALTHY, 10)
	healthBecomes(t, h, dev, Unhealthy)
	if got, _ := h.Health(t.Context(), []Device{dp}); len(got) != 0 {
		t.Errorf("a device plugin device: %v, want nothing", got)
	}

	// The report's timeout passes with no new report: Unknown.
	fc.Step(11 * time.Second)
	if got, _ := h.Health(t.Context(), []Device{dev}); got[dev.ID] != Unknown {
		t.Errorf("11 s after a report with a 10 s timeout: %q, want Unknown", got[dev.ID])
	}

	// The driver goes away: Unknown; it comes back: read again.
	drv.reports <- report("node-1", "dev-0", drahealthv1.HealthStatus_HEALTHY, 0)
	healthBecomes(t, h, dev, Healthy)
	stop()
	healthBecomes(t, h, dev, Unknown)
	serveDriver(t, dir, "fake.dpkit.io", drv)
	<-drv.opened
	drv.reports <- report("node-1", "dev-0", drahealthv1.HealthStatus_UNHEALTHY, 0)
	healthBecomes(t, h, dev, Unhealthy)

	// The exporter serves it for a claim's device the pod status lacks.
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{}
	n.addPod("ns", "train", "main", nil, claim("ns", "c1", "dev-0"))
	serve(t, n, socket)
	e, _ := newExporter(t, Config{Socket: socket, Health: h})
	if err := testutil.CollectAndCompare(e, strings.NewReader(`# HELP dpkit_pod_device_health 1 for the health a held device has (Healthy, Unhealthy, Unknown), 0 for the others; only for devices whose health is known.
# TYPE dpkit_pod_device_health gauge
dpkit_pod_device_health{claim="c1",claim_namespace="ns",container="main",device="dev-0",device_id="fake.dpkit.io/node-1/dev-0",driver="fake.dpkit.io",health="Healthy",namespace="ns",numa_node="",pod="train",pool="node-1",resource="",share=""} 0
dpkit_pod_device_health{claim="c1",claim_namespace="ns",container="main",device="dev-0",device_id="fake.dpkit.io/node-1/dev-0",driver="fake.dpkit.io",health="Unhealthy",namespace="ns",numa_node="",pod="train",pool="node-1",resource="",share=""} 1
dpkit_pod_device_health{claim="c1",claim_namespace="ns",container="main",device="dev-0",device_id="fake.dpkit.io/node-1/dev-0",driver="fake.dpkit.io",health="Unknown",namespace="ns",numa_node="",pod="train",pool="node-1",resource="",share=""} 0
`), "dpkit_pod_device_health"); err != nil {
		t.Error(err)
	}

	// A driver without health reporting: none, ever.
	none := &healthDriver{opened: make(chan struct{}, 10), unimplemented: true}
	serveDriver(t, dir, "quiet.dpkit.io", none)
	q := Device{Driver: "quiet.dpkit.io", Pool: "p", Name: "d", ID: "quiet.dpkit.io/p/d"}
	if got, _ := h.Health(t.Context(), []Device{q}); len(got) != 0 {
		t.Errorf("a driver without health: %v", got)
	}
	<-none.opened
	if got, _ := h.Health(t.Context(), []Device{q}); len(got) != 0 {
		t.Errorf("a driver that answered Unimplemented: %v", got)
	}

	if _, err := NewDRAHealth(DRAHealthConfig{}); err == nil || !strings.Contains(err.Error(), "pluginsDir") {
		t.Errorf("no plugins dir: %v", err)
	}
	if _, err := h.Health(context.Background(), []Device{{Driver: "../x", Pool: "p", Name: "d"}}); err == nil {
		t.Error("a driver name with a path in it was read")
	}
}

// TestDRAHealthBounded keeps at most MaxDevicesPerDriver devices of a
// driver, those reported last: a driver (or whatever serves its socket)
// that reports ever new device names cannot grow the exporter's memory
// without limit. Names empty or longer than 1024 bytes are skipped, and
// the driver is named once per stream in a WARN, not once per device.
func TestDRAHealthBounded(t *testing.T) {
	t.Parallel()
	const driver, bound, extra = "many.dpkit.io", 5, 7
	dir := t.TempDir()
	drv := &healthDriver{reports: make(chan *drahealthv1.NodeWatchResourcesResponse), opened: make(chan struct{}, 10)}
	serveDriver(t, dir, driver, drv)
	logs := &syncbuf.Buffer{}
	h, err := NewDRAHealth(DRAHealthConfig{
		PluginsDir: dir, MaxDevicesPerDriver: bound,
		Clock: clocktesting.NewFakeClock(time.Unix(1000, 0)), Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	dev := func(i int) Device {
		name := fmt.Sprintf("dev-%d", i)
		return Device{Driver: driver, Pool: "node-1", Name: name, ID: driver + "/node-1/" + name}
	}
	known := func(t *testing.T, i int, want string) {
		t.Helper()
		got, err := h.Health(t.Context(), []Device{dev(i)})
		if err != nil {
			t.Fatal(err)
		}
		if got[dev(i).ID] != want {
			t.Errorf("%s: %q, want %q", dev(i).ID, got[dev(i).ID], want)
		}
	}
	kept := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		dh := h.drivers[driver]
		if len(dh.devices) != dh.order.Len() {
			t.Errorf("%d devices in the map, %d in the order", len(dh.devices), dh.order.Len())
		}
		return len(dh.devices)
	}

	if _, err := h.Health(t.Context(), []Device{dev(0)}); err != nil {
		t.Fatal(err)
	}
	<-drv.opened
	// dev-0 to dev-(bound-1), then dev-0 again: it is now the newest.
	for i := range bound {
		drv.reports <- report("node-1", fmt.Sprintf("dev-%d", i), drahealthv1.HealthStatus_HEALTHY, 0)
	}
	drv.reports <- report("node-1", "dev-0", drahealthv1.HealthStatus_UNHEALTHY, 0)
	healthBecomes(t, h, dev(0), Unhealthy)
	if n := kept(); n != bound {
		t.Fatalf("%d devices reported: %d kept", bound, n)
	}
	// One more: the one reported longest ago goes, dev-1, not dev-0.
	drv.reports <- report("node-1", fmt.Sprintf("dev-%d", bound), drahealthv1.HealthStatus_HEALTHY, 0)
	healthBecomes(t, h, dev(bound), Healthy)
	known(t, 0, Unhealthy)
	known(t, 1, "")
	// extra in all, one report each: the newest bound are kept.
	last := bound + extra - 1
	for i := bound + 1; i <= last; i++ {
		drv.reports <- report("node-1", fmt.Sprintf("dev-%d", i), drahealthv1.HealthStatus_HEALTHY, 0)
	}
	healthBecomes(t, h, dev(last), Healthy)
	if n := kept(); n != bound {
		t.Errorf("%d devices reported: %d kept, want %d", bound+extra, n, bound)
	}
	for i := 0; i <= last; i++ {
		if i > last-bound {
			known(t, i, Healthy)
		} else {
			known(t, i, "")
		}
	}

	// Names empty or too long are skipped; the bound still holds.
	long := strings.Repeat("x", 1025)
	drv.reports <- &drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{
		{Device: &drahealthv1.DeviceIdentifier{PoolName: "", DeviceName: "d"}, Health: drahealthv1.HealthStatus_HEALTHY},
		{Device: &drahealthv1.DeviceIdentifier{PoolName: "p", DeviceName: ""}, Health: drahealthv1.HealthStatus_HEALTHY},
		{Device: &drahealthv1.DeviceIdentifier{PoolName: long, DeviceName: "d"}, Health: drahealthv1.HealthStatus_HEALTHY},
		{Device: &drahealthv1.DeviceIdentifier{PoolName: "p", DeviceName: long}, Health: drahealthv1.HealthStatus_HEALTHY},
	}}
	// A report of a kept device: the WARN of the reports before it is
	// written once it is read.
	drv.reports <- report("node-1", fmt.Sprintf("dev-%d", last), drahealthv1.HealthStatus_UNHEALTHY, 0)
	healthBecomes(t, h, dev(last), Unhealthy)
	for _, d := range []Device{
		{Driver: driver, Pool: "", Name: "d", ID: "a"}, {Driver: driver, Pool: "p", Name: "", ID: "b"},
		{Driver: driver, Pool: long, Name: "d", ID: "c"}, {Driver: driver, Pool: "p", Name: long, ID: "d"},
	} {
		if got, _ := h.Health(t.Context(), []Device{d}); len(got) != 0 {
			t.Errorf("a device named %.10q/%.10q: %v, want nothing", d.Pool, d.Name, got)
		}
	}
	if n := kept(); n != bound {
		t.Errorf("after names skipped: %d kept, want %d", n, bound)
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 {
		t.Errorf("%d WARN lines, want 1 for the stream:\n%s", n, logs)
	}
	if l := logs.String(); !strings.Contains(l, "driver="+driver) || !strings.Contains(l, fmt.Sprintf("maxDevicesPerDriver=%d", bound)) {
		t.Errorf("the WARN names neither the driver nor the bound:\n%s", l)
	}

	if _, err := NewDRAHealth(DRAHealthConfig{PluginsDir: dir, MaxDevicesPerDriver: -1}); err == nil || !strings.Contains(err.Error(), "maxDevicesPerDriver") {
		t.Errorf("a negative bound: %v", err)
	}
	h0, err := NewDRAHealth(DRAHealthConfig{PluginsDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if h0.cfg.MaxDevicesPerDriver != DefaultDRAHealthMaxDevices {
		t.Errorf("bound 0: %d, want the default %d", h0.cfg.MaxDevicesPerDriver, DefaultDRAHealthMaxDevices)
	}
	_ = h0.Close()
}
