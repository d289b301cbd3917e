package devicemanager

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/testdir"
)

// gatedPlugin serves ListAndWatch only once release is closed, so a test
// can see the manager between a plugin's registration and its first
// device list.
type gatedPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device
	release chan struct{}
}

func (p *gatedPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *gatedPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	select {
	case <-p.release:
	case <-s.Context().Done():
		return nil
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// serveGated serves p on a unix socket in dir and registers it as res.
func serveGated(t *testing.T, m *Manager, dir, sock string, p *gatedPlugin) (stop func()) {
	t.Helper()
	path := filepath.Join(dir, sock)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	stop = func() { srv.Stop(); <-done }
	t.Cleanup(stop)
	(&stubPlugin{socket: path, resource: res}).register(t, m.SocketPath())
	return stop
}

// healthByContainer flattens AllocatedResourcesStatus to container ->
// device -> health, checking the shape on the way: entries named by the
// resource, IDs sorted and unique.
func healthByContainer(t *testing.T, st map[string][]corev1.ResourceStatus) map[string]map[string]corev1.ResourceHealthStatus {
	t.Helper()
	out := map[string]map[string]corev1.ResourceHealthStatus{}
	for cn, list := range st {
		out[cn] = map[string]corev1.ResourceHealthStatus{}
		for _, rs := range list {
			if rs.Name != res {
				t.Errorf("container %s: resource status named %q, want %q", cn, rs.Name, res)
			}
			for i, h := range rs.Resources {
				if i > 0 && rs.Resources[i-1].ResourceID >= h.ResourceID {
					t.Errorf("container %s: resource IDs not sorted and unique: %v", cn, rs.Resources)
				}
				if h.Message != nil {
					t.Errorf("container %s: device %s has a message; device plugins have none", cn, h.ResourceID)
				}
				out[cn][string(h.ResourceID)] = h.Health
			}
		}
	}
	return out
}

// TestAllocatedResourcesStatus follows a pod's devices through the health
// a plugin reports, a device it stops listing, the plugin going away, a
// new plugin that registered but has not listed its devices yet, and the
// resource's removal after the grace period. Every container holding
// devices is reported, init and sidecar containers included.
func TestAllocatedResourcesStatus(t *testing.T) {
	dir := testdir.Short(t, "dm")
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := startManager(t, Config{Root: dir, Clock: fc, GracePeriod: time.Minute})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2", "d3", "d4"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "4 devices", func() bool { return allocatable(m, res) == 4 })
	pa, err := m.Admit(context.Background(), makePod("p1", ic("init", 1), sc("side", 1), c("app", 2)))
	if err != nil {
		t.Fatal(err)
	}
	if m.AllocatedResourcesStatus("none") != nil {
		t.Error("a pod without devices has a status")
	}
	held := map[string][]string{}
	for _, cn := range []string{"init", "side", "app"} {
		held[cn] = containerIDs(pa, cn, res)
	}
	side, app0 := held["side"][0], held["app"][0]
	// want builds the expected statuses from each device's health; a
	// device absent from health is Healthy.
	want := func(health map[string]corev1.ResourceHealthStatus) map[string]map[string]corev1.ResourceHealthStatus {
		out := map[string]map[string]corev1.ResourceHealthStatus{}
		for cn, ids := range held {
			out[cn] = map[string]corev1.ResourceHealthStatus{}
			for _, id := range ids {
				h, ok := health[id]
				if !ok {
					h = corev1.ResourceHealthStatusHealthy
				}
				out[cn][id] = h
			}
		}
		return out
	}
	all := func(h corev1.ResourceHealthStatus) map[string]corev1.ResourceHealthStatus {
		out := map[string]corev1.ResourceHealthStatus{}
		for _, id := range []string{"d1", "d2", "d3", "d4"} {
			out[id] = h
		}
		return out
	}
	expect := func(what string, w map[string]map[string]corev1.ResourceHealthStatus) {
		t.Helper()
		var got map[string]map[string]corev1.ResourceHealthStatus
		ch, cancel := m.Subscribe()
		defer cancel()
		deadline := time.NewTimer(10 * time.Second)
		defer deadline.Stop()
		for {
			got = healthByContainer(t, m.AllocatedResourcesStatus("p1"))
			if reflect.DeepEqual(got, w) {
				return
			}
			select {
			case <-ch:
			case <-deadline.C:
				t.Fatalf("%s: health %v, want %v", what, got, w)
			}
		}
	}

	expect("all reported healthy", want(nil))

	unhealthy := devs("d1", "d2", "d3", "d4")
	for _, d := range unhealthy {
		if d.ID == app0 {
			d.Health = pluginapi.Unhealthy
		}
	}
	p.setDevices(unhealthy)
	expect(fmt.Sprintf("%s reported unhealthy", app0), want(map[string]corev1.ResourceHealthStatus{app0: corev1.ResourceHealthStatusUnhealthy}))

	var without []*pluginapi.Device
	for _, d := range devs("d1", "d2", "d3", "d4") {
		if d.ID != side {
			without = append(without, d)
		}
	}
	p.setDevices(without)
	expect(fmt.Sprintf("%s no longer listed", side), want(map[string]corev1.ResourceHealthStatus{side: corev1.ResourceHealthStatusUnknown}))

	p.stop()
	expect("plugin gone", want(all(corev1.ResourceHealthStatusUnknown)))

	// A new plugin registers; until it lists its devices their health is
	// not known.
	g := &gatedPlugin{devices: devs("d1", "d2", "d3", "d4"), release: make(chan struct{})}
	stopGated := serveGated(t, m, PluginDir(dir), "gated.sock", g)
	waitFor(t, m, "new plugin connected", func() bool { r := m.Resources(); return len(r) == 1 && r[0].Connected })
	if got, w := healthByContainer(t, m.AllocatedResourcesStatus("p1")), want(all(corev1.ResourceHealthStatusUnknown)); !reflect.DeepEqual(got, w) {
		t.Fatalf("registered but not listed yet: health %v, want %v", got, w)
	}
	close(g.release)
	expect("new plugin listed its devices", want(nil))

	stopGated()
	expect("new plugin gone", want(all(corev1.ResourceHealthStatusUnknown)))
	fc.Step(2 * time.Minute)
	waitFor(t, m, "resource removed", func() bool { return len(m.Resources()) == 0 })
	expect("resource removed", want(all(corev1.ResourceHealthStatusUnknown)))
}
