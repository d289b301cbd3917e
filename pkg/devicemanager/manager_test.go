package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
	"github.com/dpkit/dpkit/pkg/topology"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const res = "example.com/dev"

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"ok", Config{Root: "/r"}, nil},
		{"missing root", Config{}, []string{"config.root: Required"}},
		{"relative root", Config{Root: "r"}, []string{"config.root: Invalid", "absolute"}},
		{"everything wrong", Config{Root: "/r", TopologyScope: "node", TopologyPolicy: "restricted", GracePeriod: -1, NUMANodes: []int{70}},
			[]string{"config.topologyScope", "config.topologyPolicy", "config.gracePeriod", "config.numaNodes[0]"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tc.cfg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("New accepted an invalid config")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestRegistrationValidation(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir, DialTimeout: time.Second})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a"))
	conn := func(req *pluginapi.RegisterRequest) error {
		c, err := grpcDial(m.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = pluginapi.NewRegistrationClient(c).Register(ctx, req)
		return err
	}
	tests := []struct {
		name string
		req  *pluginapi.RegisterRequest
		want string
	}{
		{"bad version", &pluginapi.RegisterRequest{Version: "v1alpha1", Endpoint: "dev.sock", ResourceName: res},
			`requested API version "v1alpha1" is not supported by kubelet. Supported version is ["v1beta1"]`},
		{"native resource", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "dev.sock", ResourceName: "cpu"}, `the ResourceName "cpu" is invalid`},
		{"kubernetes.io", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "dev.sock", ResourceName: "kubernetes.io/x"}, `the ResourceName "kubernetes.io/x" is invalid`},
		{"no socket", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "missing.sock", ResourceName: res}, "failed to dial device plugin: context deadline exceeded"},
		{"ok", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "dev.sock", ResourceName: res,
			Options: &pluginapi.DevicePluginOptions{PreStartRequired: true}}, ""},
	}
	for _, tc := range tests {
		err := conn(tc.req)
		if tc.want == "" {
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			continue
		}
		// The kubelet's errors are plain: the plugin sees code Unknown.
		if st := status.Convert(err); err == nil || st.Message() != tc.want || st.Code() != codes.Unknown {
			t.Fatalf("%s: error %v, want code Unknown and %q", tc.name, err, tc.want)
		}
	}
	waitFor(t, m, "device", func() bool { return allocatable(m, res) == 1 })
	// Options in RegisterRequest are not trusted: the plugin said no pre-start.
	m.mu.Lock()
	pre := m.resources[res].primary.opts.PreStartRequired
	m.mu.Unlock()
	if pre {
		t.Fatal("PreStartRequired taken from RegisterRequest instead of GetDevicePluginOptions")
	}
	_ = p
}

func TestAccountingAndHealth(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a", "b", "c"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "3 devices", func() bool { return allocatable(m, res) == 3 })
	steps := []struct {
		name      string
		devices   []*pluginapi.Device
		cap, allo int64
	}{
		{"one unhealthy", []*pluginapi.Device{{ID: "a", Health: "Healthy"}, {ID: "b", Health: "Unhealthy"}, {ID: "c", Health: "Healthy"}}, 3, 2},
		{"health is case sensitive", []*pluginapi.Device{{ID: "a", Health: "healthy"}, {ID: "b", Health: ""}, {ID: "c", Health: "Healthy"}}, 3, 1},
		{"set replaced", devs("x", "y", "z", "w"), 4, 4},
		{"empty", nil, 0, 0},
	}
	for _, s := range steps {
		p.setDevices(s.devices)
		// Every message is checkpointed (as the kubelet does): the
		// registered devices are the healthy ones of the latest list, and
		// subscribers hear of the change once it is written.
		var registered []string
		waitFor(t, m, s.name, func() bool {
			c, a := m.Capacity()
			if c[res] != s.cap || a[res] != s.allo {
				return false
			}
			cp, err := checkpoint.Read(m.CheckpointPath())
			if err != nil {
				return false
			}
			registered = cp.Registered[res]
			return int64(len(registered)) == s.allo
		})
		// An empty list empties the resource; it does not remove it: the
		// kubelet keeps advertising it (with capacity 0) while its plugin
		// is connected, and the checkpoint records it.
		if rs := m.Resources(); len(rs) != 1 || rs[0].Name != res || !rs[0].Connected {
			t.Fatalf("%s: resources %+v, want %s, connected", s.name, rs, res)
		}
		if cp, err := checkpoint.Read(m.CheckpointPath()); err != nil || cp.Registered[res] == nil {
			t.Fatalf("%s: checkpoint %+v, %v: want %s registered", s.name, cp, err, res)
		}
	}
}

func grpcDial(sock string) (interface {
	Close() error
	grpcConn
}, error) {
	return dialForTest(sock)
}

func TestAdmit(t *testing.T) {
	type admitStep struct {
		pod     *podSpec
		want    map[string]map[string][]string // container -> resource -> IDs (nil: just no error)
		wantErr string
		reason  string
		// wantCalls are exactly the plugin calls this step makes; an empty
		// non-nil slice means none.
		wantCalls []string
	}
	type tcase struct {
		name    string
		policy  string
		scope   string
		devices []*pluginapi.Device
		opts    *pluginapi.DevicePluginOptions
		prefer  func(*pluginapi.ContainerPreferredAllocationRequest) []string
		steps   []admitStep
	}
	n0 := map[int64][]string{0: {"a0", "b0"}, 1: {"a1", "b1"}}
	tests := []tcase{
		{
			name:    "simple",
			devices: devs("d1", "d2", "d3"),
			steps: []admitStep{
				{pod: pod("p1", c("app", 2)), want: map[string]map[string][]string{"app": {res: {"d2", "d3"}}}, wantCalls: []string{"Allocate:[d2 d3]"}},
				{pod: pod("p2", c("app", 2)), wantErr: "requested number of devices unavailable for example.com/dev. Requested: 2, Available: 1", reason: ReasonUnexpectedAdmissionError},
				{pod: pod("p3", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"d1"}}}},
			},
		},
		{
			name:    "init container devices are reused by app containers",
			devices: devs("d1", "d2", "d3"),
			steps: []admitStep{
				{pod: pod("p1", ic("init", 2), c("app", 1), c("app2", 1)),
					want: map[string]map[string][]string{"init": {res: {"d2", "d3"}}, "app": {res: {"d2"}}, "app2": {res: {"d3"}}}},
				{pod: pod("p2", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"d1"}}}},
			},
		},
		{
			name:    "sidecar keeps its devices",
			devices: devs("d1", "d2", "d3"),
			steps: []admitStep{
				{pod: pod("p1", sc("sidecar", 1), ic("init", 1), c("app", 2)),
					want: map[string]map[string][]string{"sidecar": {res: {"d3"}}, "init": {res: {"d2"}}, "app": {res: {"d1", "d2"}}}},
			},
		},
		{
			name:    "unhealthy devices are not allocated",
			devices: []*pluginapi.Device{{ID: "d1", Health: "Unhealthy"}, {ID: "d2", Health: "Healthy"}},
			steps: []admitStep{
				{pod: pod("p1", c("app", 2)), wantErr: "requested number of devices unavailable for example.com/dev. Requested: 2, Available: 1"},
				{pod: pod("p2", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"d2"}}}},
			},
		},
		{
			name:    "no healthy devices",
			devices: []*pluginapi.Device{{ID: "d1", Health: "Unhealthy"}},
			steps: []admitStep{
				{pod: pod("p1", c("app", 1)), wantErr: "no healthy devices present; cannot allocate unhealthy devices example.com/dev", reason: ReasonUnexpectedAdmissionError},
			},
		},
		{
			name:    "re-admission does not allocate twice",
			devices: devs("d1", "d2"),
			steps: []admitStep{
				{pod: pod("p1", c("app", 1)), wantCalls: []string{"Allocate:[d2]"}},
				{pod: pod("p1", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"d2"}}}, wantCalls: []string{}},
				{pod: pod("p1", c("app", 2)), wantErr: `pod "p1" container "app" changed request for resource "example.com/dev" from 1 to 2`},
			},
		},
		{
			name:    "preferred allocation",
			devices: devs("d1", "d2", "d3", "d4"),
			opts:    &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
			prefer:  func(*pluginapi.ContainerPreferredAllocationRequest) []string { return []string{"d1", "d4", "d9"} },
			steps: []admitStep{
				{pod: pod("p1", c("app", 3)), want: map[string]map[string][]string{"app": {res: {"d1", "d2", "d4"}}},
					wantCalls: []string{"Preferred:3 []", "Allocate:[d1 d2 d4]"}},
			},
		},
		{
			name:    "preferred allocation with reused devices as mustInclude",
			devices: devs("d1", "d2", "d3", "d4"),
			opts:    &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
			prefer: func(r *pluginapi.ContainerPreferredAllocationRequest) []string {
				return r.AvailableDeviceIDs[:r.AllocationSize]
			},
			steps: []admitStep{
				{pod: pod("p1", ic("init", 1), c("app", 2)),
					want:      map[string]map[string][]string{"init": {res: {"d1"}}, "app": {res: {"d1", "d2"}}},
					wantCalls: []string{"Preferred:1 []", "Allocate:[d1]", "Preferred:2 [d1]", "Allocate:[d1 d2]"}},
			},
		},
		{
			name:    "best-effort aligns to one NUMA node",
			policy:  topology.PolicyBestEffort,
			devices: numaDevs(map[int64][]string{0: {"a0"}, 1: {"a1", "b1"}}),
			steps: []admitStep{
				{pod: pod("p1", c("app", 2)), want: map[string]map[string][]string{"app": {res: {"a1", "b1"}}}},
				{pod: pod("p2", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"a0"}}}},
			},
		},
		{
			name:    "restricted rejects a cross-NUMA request when a narrower one was possible",
			policy:  topology.PolicyRestricted,
			devices: numaDevs(map[int64][]string{0: {"a0", "b0"}, 1: {"a1"}}),
			steps: []admitStep{
				{pod: pod("p1", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"b0"}}}},
				{pod: pod("p2", c("app", 2)), wantErr: "Resources cannot be allocated with Topology locality", reason: ReasonTopologyAffinityError},
				{pod: pod("p3", c("app", 1)), want: map[string]map[string][]string{"app": {res: {"a0"}}}},
			},
		},
		{
			name:    "single-numa-node rejects spanning requests",
			policy:  topology.PolicySingleNUMANode,
			devices: numaDevs(n0),
			steps: []admitStep{
				{pod: pod("p1", c("app", 3)), wantErr: "Resources cannot be allocated with Topology locality", reason: ReasonTopologyAffinityError},
				{pod: pod("p2", c("app", 2)), want: map[string]map[string][]string{"app": {res: {"a0", "b0"}}}},
			},
		},
		{
			name:    "pod scope aligns all containers to one node",
			policy:  topology.PolicySingleNUMANode,
			scope:   topology.ScopePod,
			devices: numaDevs(map[int64][]string{0: {"a0"}, 1: {"a1", "b1"}}),
			steps: []admitStep{
				{pod: pod("p1", c("c1", 1), c("c2", 1)), want: map[string]map[string][]string{"c1": {res: {"b1"}}, "c2": {res: {"a1"}}}},
				{pod: pod("p2", c("c1", 1), c("c2", 1)), wantErr: "Resources cannot be allocated with Topology locality", reason: ReasonTopologyAffinityError},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := testdir.Short(t, "dm")
			m := startManager(t, Config{Root: dir, TopologyPolicy: tc.policy, TopologyScope: tc.scope, NUMANodes: []int{0, 1}})
			p := newStub(t, PluginDir(dir), res, "dev.sock", tc.opts, tc.devices)
			p.prefer = tc.prefer
			p.register(t, m.SocketPath())
			healthy := 0
			for _, d := range tc.devices {
				if d.Health == pluginapi.Healthy {
					healthy++
				}
			}
			waitFor(t, m, "devices", func() bool {
				c, a := m.Capacity()
				return c[res] == int64(len(tc.devices)) && a[res] == int64(healthy)
			})
			for i, s := range tc.steps {
				before := len(p.Calls())
				pa, err := m.Admit(context.Background(), s.pod.build())
				if s.wantErr != "" {
					if err == nil || err.Error() != s.wantErr {
						t.Fatalf("step %d: error %v, want %q", i, err, s.wantErr)
					}
					var ae *AdmissionError
					if !errors.As(err, &ae) || (s.reason != "" && ae.Reason != s.reason) {
						t.Fatalf("step %d: error %#v, want reason %q", i, err, s.reason)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: Admit: %v", i, err)
				}
				for cn, rs := range s.want {
					for rn, ids := range rs {
						if got := containerIDs(pa, cn, rn); !reflect.DeepEqual(got, ids) {
							t.Fatalf("step %d: container %s got %v, want %v", i, cn, got, ids)
						}
					}
				}
				if s.wantCalls != nil {
					if got := p.Calls()[before:]; len(got) != len(s.wantCalls) || (len(got) > 0 && !reflect.DeepEqual(got, s.wantCalls)) {
						t.Fatalf("step %d: plugin calls %v, want %v", i, got, s.wantCalls)
					}
				}
			}
			checkInvariant(t, m)
		})
	}
}

type podSpec struct {
	uid  string
	ctrs []ctr
}

func (p *podSpec) build() *corev1Pod { return makePod(p.uid, p.ctrs...) }

func pod(uid string, cs ...ctr) *podSpec { return &podSpec{uid, cs} }
func c(name string, n int64) ctr         { return ctr{name: name, req: map[string]int64{res: n}} }
func ic(name string, n int64) ctr        { return ctr{name: name, req: map[string]int64{res: n}, init: true} }
func sc(name string, n int64) ctr {
	return ctr{name: name, req: map[string]int64{res: n}, init: true, restartOK: true}
}

// checkInvariant verifies that no device is held by two pods, that no two
// containers of a pod that run together (app containers and sidecars; test
// names of plain init containers start with "init") share a device, and
// that the free pools and the owner map agree with the allocations.
func checkInvariant(t testing.TB, m *Manager) {
	t.Helper()
	holder := map[string]string{}
	for _, pa := range m.Pods() {
		running := map[string]string{}
		for _, c := range pa.Containers {
			for _, r := range c.Resources {
				for _, id := range r.DeviceIDs {
					k := r.Resource + "/" + id
					if h, ok := holder[k]; ok && h != pa.PodUID {
						t.Fatalf("device %s held by pods %s and %s", k, h, pa.PodUID)
					}
					holder[k] = pa.PodUID
					if strings.HasPrefix(c.Name, "init") {
						continue
					}
					if other, ok := running[k]; ok {
						t.Fatalf("device %s held by containers %s and %s of pod %s", k, other, c.Name, pa.PodUID)
					}
					running[k] = c.Name
				}
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for rn, o := range m.owner {
		for id, uid := range o {
			if holder[rn+"/"+id] != uid {
				t.Fatalf("owner map says %s/%s is held by %s, allocations say %q", rn, id, uid, holder[rn+"/"+id])
			}
		}
	}
	owned := 0
	for _, o := range m.owner {
		owned += len(o)
	}
	if owned != len(holder) {
		t.Fatalf("owner map holds %d devices, allocations %d", owned, len(holder))
	}
	for _, r := range m.resources {
		for _, p := range r.free {
			for _, d := range p.devs {
				if !d.healthy {
					t.Fatalf("unhealthy device %s is free", d.id)
				}
				if _, ok := m.owner[r.name][d.id]; ok {
					t.Fatalf("device %s is free and held", d.id)
				}
			}
		}
	}
}

func TestZeroContainerResponsesDoesNotLeak(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2"))
	p.allocate = func([]string) (*pluginapi.AllocateResponse, error) { return &pluginapi.AllocateResponse{}, nil }
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 })
	for i := 0; i < 3; i++ {
		_, err := m.Admit(context.Background(), makePod(fmt.Sprint("p", i), c("app", 2)))
		if err == nil || !strings.HasPrefix(err.Error(), "no containers return in allocation response") {
			t.Fatalf("attempt %d: error %v", i, err)
		}
	}
	if got := m.Resources()[0].InUse; got != 0 {
		t.Fatalf("InUse = %d after failed admissions, want 0 (devices leaked)", got)
	}
	if len(m.Pods()) != 0 {
		t.Fatalf("pods recorded after failed admissions: %v", m.Pods())
	}
}

func TestAllocateDeadline(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir, AllocateTimeout: 200 * time.Millisecond})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1"))
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	p.allocate = func([]string) (*pluginapi.AllocateResponse, error) {
		<-block
		return nil, errBoom
	}
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 1 })
	_, err := m.Admit(context.Background(), makePod("p1", c("app", 1)))
	if status.Code(errors.Unwrap(err)) != codes.DeadlineExceeded {
		t.Fatalf("Admit error %v, want DeadlineExceeded", err)
	}
	if m.Resources()[0].InUse != 0 {
		t.Fatal("device still reserved after a timed-out Allocate")
	}
}

// TestAdmissionInterrupted: an Allocate cut off because the caller gave
// up or the manager is stopping (a node shutting down) is no admission
// failure: Admit returns no *AdmissionError, so the pod is not rejected
// and the next run admits it; its devices are released meanwhile.
func TestAdmissionInterrupted(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
		// interrupt cuts the admission off; cancel is its context's.
		interrupt func(m *Manager, cancel context.CancelFunc)
	}{
		{"caller gave up", context.Canceled, func(_ *Manager, cancel context.CancelFunc) { cancel() }},
		{"manager stopping", ErrNotStarted, func(m *Manager, _ context.CancelFunc) { m.Stop() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testdir.Short(t, "dm")
			m := startManager(t, Config{Root: dir})
			p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1"))
			inFlight, release := make(chan struct{}, 1), make(chan struct{})
			t.Cleanup(func() { close(release) }) // before the stub's server stops
			p.allocate = func([]string) (*pluginapi.AllocateResponse, error) {
				inFlight <- struct{}{}
				<-release
				return nil, errBoom
			}
			p.register(t, m.SocketPath())
			waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 1 })
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			admitted := make(chan error, 1)
			go func() {
				_, err := m.Admit(ctx, makePod("p1", c("app", 1)))
				admitted <- err
			}()
			<-inFlight
			tc.interrupt(m, cancel)
			err := <-admitted
			var ae *AdmissionError
			if errors.As(err, &ae) || !errors.Is(err, tc.want) {
				t.Fatalf("Admit error %v, want one wrapping %v and no *AdmissionError", err, tc.want)
			}
			if len(m.Pods()) != 0 {
				t.Fatalf("pods recorded after an interrupted admission: %v", m.Pods())
			}
		})
	}
}

func TestAllocateErrorReleasesAndRollsBackPod(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	a := newStub(t, PluginDir(dir), res, "a.sock", nil, devs("d1", "d2"))
	b := newStub(t, PluginDir(dir), "example.com/other", "b.sock", nil, devs("o1"))
	b.allocate = func([]string) (*pluginapi.AllocateResponse, error) {
		return nil, status.Error(codes.Internal, "broken")
	}
	a.register(t, m.SocketPath())
	b.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 && allocatable(m, "example.com/other") == 1 })
	pod := makePod("p1", ctr{name: "app", req: map[string]int64{res: 1, "example.com/other": 1}})
	if _, err := m.Admit(context.Background(), pod); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("Admit error %v", err)
	}
	for _, r := range m.Resources() {
		if r.InUse != 0 {
			t.Fatalf("%s: %d devices in use after a failed admission", r.Name, r.InUse)
		}
	}
}

func TestContainerOptionsAndPreStart(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	a := newStub(t, PluginDir(dir), "example.com/a", "a.sock", &pluginapi.DevicePluginOptions{PreStartRequired: true}, devs("a1"))
	b := newStub(t, PluginDir(dir), "example.com/b", "b.sock", nil, devs("b1"))
	a.allocate = func(ids []string) (*pluginapi.AllocateResponse, error) {
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{
			Envs:        map[string]string{"SHARED": "from-a", "A": "1"},
			Mounts:      []*pluginapi.Mount{{ContainerPath: "/m", HostPath: "/host/a", ReadOnly: true}},
			Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/a", Permissions: "rw"}},
			Annotations: map[string]string{"k": "a"},
			CdiDevices:  []*pluginapi.CDIDevice{{Name: "vendor.com/dev=one"}},
		}}}, nil
	}
	b.allocate = func(ids []string) (*pluginapi.AllocateResponse, error) {
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{
			Envs:        map[string]string{"SHARED": "from-b", "B": "2"},
			Mounts:      []*pluginapi.Mount{{ContainerPath: "/m", HostPath: "/host/b"}, {ContainerPath: "/n", HostPath: "/host/n"}},
			Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/x", HostPath: "/dev/b"}, {ContainerPath: "/dev/y", HostPath: "/dev/y", Permissions: "r"}},
			Annotations: map[string]string{"k": "b", "l": "b"},
			CdiDevices:  []*pluginapi.CDIDevice{{Name: "vendor.com/dev=one"}, {Name: "vendor.com/dev=two"}},
		}}}, nil
	}
	a.register(t, m.SocketPath())
	b.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, "example.com/a") == 1 && allocatable(m, "example.com/b") == 1 })
	pod := makePod("p1", ctr{name: "app", req: map[string]int64{"example.com/a": 1, "example.com/b": 1}})
	if _, err := m.Admit(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	got := m.ContainerOptions(pod.UID, "app")
	want := &ContainerOptions{
		Envs:        []KeyValue{{"A", "1"}, {"SHARED", "from-a"}, {"B", "2"}},
		Mounts:      []Mount{{"/m", "/host/a", true}, {"/n", "/host/n", false}},
		Devices:     []DeviceSpec{{"/dev/x", "/dev/a", "rw"}, {"/dev/y", "/dev/y", "r"}},
		Annotations: []KeyValue{{"k", "a"}, {"l", "b"}},
		CDIDevices:  []string{"vendor.com/dev=one", "vendor.com/dev=two"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ContainerOptions =\n%+v\nwant\n%+v", got, want)
	}
	if m.ContainerOptions(pod.UID, "other") != nil {
		t.Fatal("options for a container without devices")
	}
	if err := m.PreStartContainer(context.Background(), pod.UID, "app"); err != nil {
		t.Fatal(err)
	}
	if calls := a.Calls(); calls[len(calls)-1] != "PreStart:[a1]" {
		t.Fatalf("plugin a calls %v", calls)
	}
	for _, call := range b.Calls() {
		if strings.HasPrefix(call, "PreStart") {
			t.Fatal("PreStartContainer called on a plugin that did not ask for it")
		}
	}
	a.preStart = func([]string) error { return status.Error(codes.Unavailable, "reset failed") }
	if err := m.PreStartContainer(context.Background(), pod.UID, "app"); err == nil || !strings.Contains(err.Error(), "device plugin PreStartContainer rpc failed with err") {
		t.Fatalf("PreStartContainer error %v", err)
	}
	gd := m.GetDevices("p1", "app")
	if len(gd) != 2 || gd[0].ResourceName != "example.com/a" || gd[0].DeviceIds[0] != "a1" || gd[0].Topology != nil {
		t.Fatalf("GetDevices = %v", gd)
	}
	if all := m.GetAllocatableDevices(); len(all) != 2 {
		t.Fatalf("GetAllocatableDevices = %v", all)
	}
}

func TestDisconnectAndGracePeriod(t *testing.T) {
	dir := testdir.Short(t, "dm")
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := startManager(t, Config{Root: dir, Clock: fc, GracePeriod: time.Minute})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 })
	if _, err := m.Admit(context.Background(), makePod("p1", c("app", 1))); err != nil {
		t.Fatal(err)
	}
	p.stop()
	waitFor(t, m, "unhealthy after disconnect", func() bool {
		r := m.Resources()
		return len(r) == 1 && !r[0].Connected && r[0].Allocatable == 0 && r[0].Capacity == 2
	})
	_, err := m.Admit(context.Background(), makePod("p2", c("app", 1)))
	if err == nil || err.Error() != "no healthy devices present; cannot allocate unhealthy devices example.com/dev" {
		t.Fatalf("Admit after disconnect: %v", err)
	}
	fc.Step(59 * time.Second)
	if len(m.Resources()) != 1 {
		t.Fatal("resource removed before the grace period")
	}
	fc.Step(2 * time.Second)
	waitFor(t, m, "resource removed", func() bool { return len(m.Resources()) == 0 })
	// The pod keeps its assignment.
	if got := containerIDs(m.PodAllocation("p1"), "app", res); len(got) != 1 {
		t.Fatalf("assignment lost: %v", got)
	}
}

// TestGracePeriodEndsUnasked: the resource goes when the grace period
// ends with nobody reading the manager: subscribers hear of it then (a
// node's status drops the resource), from the loop that runs only while
// a resource waits for its plugin.
func TestGracePeriodEndsUnasked(t *testing.T) {
	dir := testdir.Short(t, "dm")
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	m := startManager(t, Config{Root: dir, Clock: fc, GracePeriod: time.Minute})
	if fc.HasWaiters() {
		t.Fatal("a timer runs with no resource waiting for its plugin")
	}
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 1 })
	p.stop()
	waitFor(t, m, "unhealthy after disconnect", func() bool {
		r := m.Resources()
		return len(r) == 1 && !r[0].Connected
	})
	// The loop's timer, then the grace period passed.
	deadline := time.Now().Add(10 * time.Second)
	for !fc.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("no grace period timer after the plugin went")
		}
		runtime.Gosched()
	}
	ch, cancel := m.Subscribe()
	defer cancel()
	fc.Step(61 * time.Second)
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("no notification when the grace period ended")
	}
	m.mu.Lock()
	left, running := len(m.resources), m.gcRunning
	m.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d resources left after the grace period", left)
	}
	if running {
		t.Error("the grace period loop still runs with no resource waiting")
	}
}

func TestNewInstanceNotDisconnectedWhenOldExits(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	old := newStub(t, PluginDir(dir), res, "old.sock", nil, devs("d1"))
	old.register(t, m.SocketPath())
	waitFor(t, m, "old devices", func() bool { return allocatable(m, res) == 1 })
	nw := newStub(t, PluginDir(dir), res, "new.sock", nil, devs("d1", "d2"))
	nw.register(t, m.SocketPath())
	waitFor(t, m, "new devices", func() bool { return allocatable(m, res) == 2 })
	// An update from the old instance is ignored.
	old.setDevices(devs("zz"))
	old.stop()
	waitFor(t, m, "old endpoint gone", func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.resources[res].endpoints) == 1
	})
	r := m.Resources()[0]
	if !r.Connected || r.Allocatable != 2 {
		t.Fatalf("after the old instance exited: %+v", r)
	}
	nw.setDevices(devs("d1", "d2", "d3"))
	waitFor(t, m, "new instance still streaming", func() bool { return allocatable(m, res) == 3 })
}

func TestPluginHandler(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	h := m.PluginHandler()
	ctx := context.Background()
	if err := h.ValidatePlugin(ctx, res, "/x", []string{"v1alpha1"}); err == nil || !strings.Contains(err.Error(), "is not among plugin supported versions") {
		t.Fatalf("ValidatePlugin version: %v", err)
	}
	if err := h.ValidatePlugin(ctx, "bad", "/x", []string{"v1beta1"}); err == nil || err.Error() != `invalid name of device plugin socket: the ResourceName "bad" is invalid` {
		t.Fatalf("ValidatePlugin name: %v", err)
	}
	pdir := testdir.Short(t, "dm")
	p := newStub(t, pdir, res, "w.sock", nil, devs("d1"))
	if err := h.RegisterPlugin(ctx, res, p.socket, []string{"v1beta1"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 1 })
	h.DeRegisterPlugin(ctx, res, p.socket)
	waitFor(t, m, "disconnected", func() bool { return !m.Resources()[0].Connected })
}

func TestRestartRestoresCheckpoint(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m, err := New(Config{Root: dir, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2", "d3"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 3 })
	pa, err := m.Admit(context.Background(), makePod("p1", c("app", 2)))
	if err != nil {
		t.Fatal(err)
	}
	m.Stop()
	p.stop()
	// A stale socket left in the directory is removed on start.
	stale := filepath.Join(PluginDir(dir), "stale.sock")
	ln, err := netListenUnix(stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()

	m2 := startManager(t, Config{Root: dir})
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale socket not removed: %v", err)
	}
	r := m2.Resources()
	if len(r) != 1 || r[0].Capacity != 0 || r[0].Connected {
		t.Fatalf("restored resources = %+v, want one with zero capacity", r)
	}
	if got := m2.PodAllocation("p1"); !sameAllocation(got, pa) {
		t.Fatalf("restored allocation %+v, want %+v", got, pa)
	}
	if opts := m2.ContainerOptions("p1", "app"); opts == nil || len(opts.Envs) != 1 {
		t.Fatalf("restored options %+v", opts)
	}
	p2 := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2", "d3"))
	p2.register(t, m2.SocketPath())
	waitFor(t, m2, "devices", func() bool { return allocatable(m2, res) == 3 })
	if m2.Resources()[0].InUse != 2 {
		t.Fatal("restored devices not in use")
	}
	_, err = m2.Admit(context.Background(), makePod("p2", c("app", 2)))
	if err == nil || err.Error() != "requested number of devices unavailable for example.com/dev. Requested: 2, Available: 1" {
		t.Fatalf("Admit after restart: %v", err)
	}
	before := len(p2.Calls())
	if _, err := m2.Admit(context.Background(), makePod("p1", c("app", 2))); err != nil {
		t.Fatal(err)
	}
	if len(p2.Calls()) != before {
		t.Fatal("re-admitting a restored pod called Allocate")
	}
	m2.RemovePod("p1")
	if m2.Resources()[0].InUse != 0 {
		t.Fatal("RemovePod did not free devices")
	}
}

func TestCorruptCheckpointIgnored(t *testing.T) {
	tests := []struct {
		name string
		data string
	}{
		{"garbage", "{{{"},
		{"bad checksum", `{"Data":{"PodDeviceEntries":[],"RegisteredDevices":{"example.com/dev":[]}},"Checksum":1}`},
		{"foreign", `{"policyName":"static","defaultCpuSet":"0-3","checksum":12}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := testdir.Short(t, "dm")
			if err := os.MkdirAll(PluginDir(dir), 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(PluginDir(dir), checkpoint.FileName), []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			m := startManager(t, Config{Root: dir})
			if len(m.Resources()) != 0 || len(m.Pods()) != 0 {
				t.Fatal("state restored from a bad checkpoint")
			}
		})
	}
}

func sameAllocation(a, b *PodAllocation) bool {
	if a == nil || b == nil || a.PodUID != b.PodUID || len(a.Containers) != len(b.Containers) {
		return a == b
	}
	for i := range a.Containers {
		ca, cb := a.Containers[i], b.Containers[i]
		if ca.Name != cb.Name || len(ca.Resources) != len(cb.Resources) {
			return false
		}
		for j := range ca.Resources {
			ra, rb := ca.Resources[j], cb.Resources[j]
			if ra.Resource != rb.Resource || !reflect.DeepEqual(ra.DeviceIDs, rb.DeviceIDs) ||
				!reflect.DeepEqual(ra.NUMANodes, rb.NUMANodes) || !proto.Equal(ra.Response, rb.Response) {
				return false
			}
		}
	}
	return true
}
