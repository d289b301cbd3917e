package devicemanager

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
	"github.com/dpkit/dpkit/pkg/topology"
)

const fakeRes = "example.com/foo"

// servePlugin serves resources through the SDK, registering on the
// manager's kubelet.sock, until the returned stop is called.
func servePlugin(t *testing.T, pluginDir string, resources []deviceplugin.Resource) (stop func()) {
	t.Helper()
	return serveWith(t, deviceplugin.Config{PluginDir: pluginDir, Registration: deviceplugin.RegistrationKubelet}, resources)
}

// currentManager is the kubelet in this process that an in-process
// plugin registers with: the manager running now, as kubelet.sock is the
// socket of the kubelet running now.
type currentManager struct{ atomic.Pointer[Manager] }

func (c *currentManager) ConnectInProcess(ctx context.Context, resource, name string, api pluginapi.DevicePluginClient) error {
	return c.Load().ConnectInProcess(ctx, resource, name, api)
}

// serveWith serves resources through the SDK with cfg until the returned
// stop is called.
func serveWith(t *testing.T, cfg deviceplugin.Config, resources []deviceplugin.Resource) (stop func()) {
	t.Helper()
	cfg.InstanceID, cfg.Logger = "t", testLogger(t)
	srv, err := deviceplugin.NewServer(cfg, resources...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin server: %v", err)
		}
	}
	t.Cleanup(stop)
	return stop
}

// fakePod asks for n example.com/foo devices in an init container and m in
// an app container.
func fakePod(uid string, n, m int64) *corev1Pod {
	var cs []ctr
	if n > 0 {
		cs = append(cs, ctr{name: "init", req: map[string]int64{fakeRes: n}, init: true})
	}
	cs = append(cs, ctr{name: "app", req: map[string]int64{fakeRes: m}})
	return makePod(uid, cs...)
}

// checkFakeResponse checks that the fake plugin's Allocate answer for a
// container names the devices the manager gave it.
func checkFakeResponse(t *testing.T, pa *PodAllocation, container string) []string {
	t.Helper()
	for _, c := range pa.Containers {
		if c.Name != container {
			continue
		}
		if len(c.Resources) != 1 || c.Resources[0].Resource != fakeRes {
			t.Fatalf("container %s resources %+v, want %s only", container, c.Resources, fakeRes)
		}
		ra := c.Resources[0]
		got := strings.Split(ra.Response.GetEnvs()[fake.EnvDevices], ",")
		slices.Sort(got)
		if !slices.Equal(got, ra.DeviceIDs) {
			t.Errorf("container %s: %s=%q in the Allocate response, want the devices %v", container, fake.EnvDevices, ra.Response.GetEnvs()[fake.EnvDevices], ra.DeviceIDs)
		}
		return ra.DeviceIDs
	}
	t.Fatalf("no allocation for container %s in %+v", container, pa)
	return nil
}

// TestFakePluginOverSockets serves the SDK's fake plugin over real unix
// sockets against a real Manager: registration, allocatable devices,
// admission with the plugin's Allocate (and GetPreferredAllocation and
// PreStartContainer where configured), then a kubelet restart that keeps
// the assignment from the checkpoint while the plugin registers again.
// The same runs in process (deviceplugin.Config.InProcess and
// ConnectInProcess), where no socket is served: the same answers.
func TestFakePluginOverSockets(t *testing.T) {
	for _, transport := range []string{"sockets", "in-process"} {
		t.Run(transport, func(t *testing.T) { testFakePlugin(t, transport == "in-process") })
	}
}

func testFakePlugin(t *testing.T, inProcess bool) {
	tests := []struct {
		name   string
		res    fake.ResourceConfig
		policy string
		numa   []int
		// check inspects the first pod's allocation.
		check func(t *testing.T, m *Manager, pa *PodAllocation, p deviceplugin.Plugin)
		// After the restart, asking for tooMany devices fails with reason
		// and message; asking for fits succeeds.
		tooMany     int64
		reason, msg string
		fits        int64
	}{
		{
			name: "defaults",
			res:  fake.ResourceConfig{Name: fakeRes},
			check: func(t *testing.T, _ *Manager, pa *PodAllocation, _ deviceplugin.Plugin) {
				init, app := checkFakeResponse(t, pa, "init"), checkFakeResponse(t, pa, "app")
				// As in the kubelet, the app container reuses its init
				// container's device.
				if len(init) != 1 || len(app) != 2 || !slices.Contains(app, init[0]) {
					t.Errorf("init devices %v, app devices %v; want the app's 2 to include the init's 1", init, app)
				}
			},
			tooMany: 7, reason: ReasonUnexpectedAdmissionError, msg: "requested number of devices unavailable for example.com/foo. Requested: 7, Available: 6",
			fits: 6,
		},
		{
			name:   "NUMA-packed preferred allocation under single-numa-node",
			res:    fake.ResourceConfig{Name: fakeRes, NUMANodes: 2, PreferredAllocation: fake.PreferNUMAPacked, PreStartRequired: true},
			policy: topology.PolicySingleNUMANode,
			numa:   []int{0, 1},
			check: func(t *testing.T, m *Manager, pa *PodAllocation, p deviceplugin.Plugin) {
				app := checkFakeResponse(t, pa, "app")
				for _, c := range pa.Containers {
					if len(c.Resources[0].NUMANodes) != 1 {
						t.Errorf("container %s devices span NUMA nodes %v, want one", c.Name, c.Resources[0].NUMANodes)
					}
				}
				if err := m.PreStartContainer(context.Background(), "p1", "app"); err != nil {
					t.Fatal(err)
				}
				if calls := preStarts(t, p); len(calls) != 1 || !slices.Equal(sorted(calls[0]), app) {
					t.Errorf("PreStartContainer calls %v, want one with %v", calls, app)
				}
			},
			// 2 free devices on the pod's node, 4 on the other.
			tooMany: 5, reason: ReasonTopologyAffinityError, msg: ErrTopologyAffinity.Error(),
			fits: 4,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := testdir.Short(t, "dm")
			cfg := fake.Config{Resources: []fake.ResourceConfig{tc.res}}
			cfg.Default()
			resources, err := fake.New(cfg, plugins.Options{Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			plugin := resources[0].Plugin
			mcfg := Config{Root: dir, Logger: testLogger(t), TopologyPolicy: tc.policy, NUMANodes: tc.numa}

			m, err := New(mcfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer m.Stop()
			var current currentManager
			current.Store(m)
			var stopPlugin func()
			if inProcess {
				stopPlugin = serveWith(t, deviceplugin.Config{PluginDir: PluginDir(dir), InProcess: &current}, resources)
			} else {
				stopPlugin = servePlugin(t, PluginDir(dir), resources)
			}
			waitFor(t, m, "8 allocatable devices", func() bool { return allocatable(m, fakeRes) == 8 })
			if rs := m.Resources(); len(rs) != 1 || !rs[0].Connected || rs[0].Capacity != 8 {
				t.Fatalf("Resources() = %+v, want %s connected with 8 devices", rs, fakeRes)
			}

			pa, err := m.Admit(context.Background(), fakePod("p1", 1, 2))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, m, pa, plugin)
			opts := m.ContainerOptions("p1", "app")
			if opts == nil || len(opts.Envs) != 1 || opts.Envs[0].Name != fake.EnvDevices {
				t.Errorf("ContainerOptions(app) = %+v, want %s", opts, fake.EnvDevices)
			}
			if rs := m.Resources(); rs[0].InUse != 2 {
				t.Errorf("%d devices in use, want 2", rs[0].InUse)
			}

			// The kubelet restarts: the checkpoint keeps the assignment and
			// the plugin, watching kubelet.sock, registers again.
			m.Stop()
			m2, err := New(mcfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := m2.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer m2.Stop()
			current.Store(m2)
			if got := m2.PodAllocation("p1"); !sameAllocation(got, pa) {
				t.Fatalf("allocation after restart %+v, want %+v", got, pa)
			}
			waitFor(t, m2, "the plugin to register again", func() bool {
				rs := m2.Resources()
				return len(rs) == 1 && rs[0].Connected && rs[0].Allocatable == 8 && rs[0].InUse == 2
			})
			_, err = m2.Admit(context.Background(), fakePod("p2", 0, tc.tooMany))
			var ae *AdmissionError
			if !errors.As(err, &ae) || ae.Reason != tc.reason || err.Error() != tc.msg {
				t.Fatalf("admitting %d devices: %v; want %s: %s", tc.tooMany, err, tc.reason, tc.msg)
			}
			// Allocate reaches the plugin over its new connection.
			pa2, err := m2.Admit(context.Background(), fakePod("p2", 0, tc.fits))
			if err != nil {
				t.Fatal(err)
			}
			p1 := append(containerIDs(pa, "app", fakeRes), containerIDs(pa, "init", fakeRes)...)
			for _, id := range checkFakeResponse(t, pa2, "app") {
				if slices.Contains(p1, id) {
					t.Errorf("device %s given to p2 while p1 holds it", id)
				}
			}

			if inProcess {
				if socks, _ := filepath.Glob(filepath.Join(PluginDir(dir), "*.sock")); len(socks) != 1 {
					t.Errorf("sockets in the plugin directory: %v, want the kubelet's alone", socks)
				}
				m2.mu.Lock()
				var endpoints []string
				for e := range m2.resources[fakeRes].endpoints {
					endpoints = append(endpoints, e)
				}
				m2.mu.Unlock()
				if len(endpoints) != 1 || !strings.HasPrefix(endpoints[0], InProcessEndpoint("")) {
					t.Errorf("endpoints %v, want one in process", endpoints)
				}
			}

			// The plugin going away leaves the devices listed, none
			// allocatable, until the grace period ends.
			stopPlugin()
			waitFor(t, m2, "the plugin to disconnect", func() bool {
				rs := m2.Resources()
				return len(rs) == 1 && !rs[0].Connected && rs[0].Allocatable == 0
			})
		})
	}
}

// preStarts returns what PreStartContainer was called with on a fake
// plugin (every wrapper of *fake.Plugin has PreStarts).
func preStarts(t *testing.T, p deviceplugin.Plugin) [][]string {
	t.Helper()
	ps, ok := p.(interface{ PreStarts() [][]string })
	if !ok {
		t.Fatalf("%T has no PreStarts", p)
	}
	return ps.PreStarts()
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
