package deviceplugin_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/syncbuf"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testPlugin serves a device set that tests change with set.
type testPlugin struct {
	mu      sync.Mutex
	devs    []deviceplugin.Device
	notify  func([]deviceplugin.Device)
	ready   chan struct{}
	allocFn func(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error)
}

func newTestPlugin(n int) *testPlugin {
	p := &testPlugin{ready: make(chan struct{})}
	for i := range n {
		p.devs = append(p.devs, deviceplugin.Device{ID: fmt.Sprintf("dev-%d", i), Healthy: true, NUMANodes: []int64{int64(i % 2)}})
	}
	return p
}

func (p *testPlugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	p.mu.Lock()
	p.notify = notify
	notify(p.devs)
	p.mu.Unlock()
	close(p.ready)
	<-ctx.Done()
	return nil
}

func (p *testPlugin) set(id string, healthy bool) {
	<-p.ready
	p.mu.Lock()
	defer p.mu.Unlock()
	devs := make([]deviceplugin.Device, len(p.devs))
	copy(devs, p.devs)
	for i := range devs {
		if devs[i].ID == id {
			devs[i].Healthy = healthy
		}
	}
	p.devs = devs
	p.notify(devs)
}

func (p *testPlugin) Allocate(ctx context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if p.allocFn != nil {
		return p.allocFn(ctx, ids)
	}
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEVICES": strings.Join(ids, ",")}}, nil
}

// preferringPlugin adds preferred allocation and a pre-start hook.
type preferringPlugin struct {
	*testPlugin
	answer   []string
	prestart chan []string
}

func (p *preferringPlugin) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	return p.answer, nil
}

func (p *preferringPlugin) PreStartContainer(_ context.Context, ids []string) error {
	p.prestart <- ids
	return nil
}

const res = "example.com/foo"

func TestRegisterListAndAllocate(t *testing.T) {
	k := dptest.NewKubelet(t)
	p := newTestPlugin(4)
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: p})

	req := k.WaitForRegistration(t, res)
	if req.Version != pluginapi.Version || !strings.HasPrefix(req.Endpoint, "example_com_foo-") {
		t.Errorf("register request = %+v", req)
	}
	if opts := k.Plugin(res).Options; opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Errorf("options = %+v, want none: the plugin implements neither capability", opts)
	}
	devs := k.WaitForDevices(t, res, dptest.Healthy(4))
	if got := devs[1].Topology.Nodes[0].ID; got != 1 {
		t.Errorf("dev-1 NUMA node = %d, want 1", got)
	}

	ctx := context.Background()
	resp, err := k.Client(t, res).Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"dev-0", "dev-1"}}, {DevicesIds: []string{"dev-2"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.ContainerResponses) != 2 || resp.ContainerResponses[0].Envs["DEVICES"] != "dev-0,dev-1" ||
		resp.ContainerResponses[1].Envs["DEVICES"] != "dev-2" {
		t.Errorf("responses = %v", resp.ContainerResponses)
	}

	p.set("dev-3", false)
	k.WaitForDevices(t, res, dptest.Health("dev-3", pluginapi.Unhealthy))

	for _, tc := range []struct {
		name string
		ids  []string
		code codes.Code
		msg  string
	}{
		{"unknown", []string{"dev-0", "nope"}, codes.InvalidArgument, `unknown device "nope"`},
		{"unhealthy", []string{"dev-3"}, codes.FailedPrecondition, `device "dev-3" is unhealthy`},
		{"duplicate", []string{"dev-0", "dev-0"}, codes.InvalidArgument, "requested twice"},
		{"empty", nil, codes.InvalidArgument, "no device IDs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.Allocate(ctx, res, tc.ids...)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("Allocate(%v) = %v, want %v containing %q", tc.ids, err, tc.code, tc.msg)
			}
		})
	}
}

func TestAuthorErrorsBecomeStatuses(t *testing.T) {
	k := dptest.NewKubelet(t)
	p := newTestPlugin(2)
	p.allocFn = func(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
		if ids[0] == "dev-0" {
			return nil, errors.New("device is busy resetting")
		}
		return nil, status.Error(codes.ResourceExhausted, "no more contexts")
	}
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: p})
	k.WaitForDevices(t, res, dptest.Count(2))
	_, err := k.Allocate(context.Background(), res, "dev-0")
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "device is busy resetting") {
		t.Errorf("plain error became %v", err)
	}
	_, err = k.Allocate(context.Background(), res, "dev-1")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "no more contexts") {
		t.Errorf("status error became %v", err)
	}
}

func TestOptionalCapabilities(t *testing.T) {
	k := dptest.NewKubelet(t)
	p := &preferringPlugin{testPlugin: newTestPlugin(4), answer: []string{"dev-3", "dev-9", "dev-3"}, prestart: make(chan []string, 1)}
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: p})
	k.WaitForDevices(t, res, dptest.Count(4))
	if opts := k.Plugin(res).Options; !opts.PreStartRequired || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("options = %+v, want both", opts)
	}
	ctx := context.Background()
	c := k.Client(t, res)
	resp, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2", "dev-3"}, MustIncludeDeviceIDs: []string{"dev-1"}, AllocationSize: 3,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	// The author's answer has a duplicate, an unknown ID and misses
	// mustInclude; the SDK repairs it.
	if got := resp.ContainerResponses[0].DeviceIDs; strings.Join(got, ",") != "dev-1,dev-3,dev-0" {
		t.Errorf("preferred = %v, want [dev-1 dev-3 dev-0]", got)
	}
	if _, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"dev-2"}}); err != nil {
		t.Fatal(err)
	}
	if got := <-p.prestart; len(got) != 1 || got[0] != "dev-2" {
		t.Errorf("pre-start got %v", got)
	}
}

func TestConcurrentStreamsAllSeeHealthChanges(t *testing.T) {
	k := dptest.NewKubelet(t)
	p := newTestPlugin(3)
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: p})
	k.WaitForDevices(t, res, dptest.Count(3))
	c := k.Client(t, res)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// A stalled stream that is never read must not hold back the others.
	stalled, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	_ = stalled
	var streams []pluginapi.DevicePlugin_ListAndWatchClient
	for range 3 {
		s, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
		if err != nil {
			t.Fatal(err)
		}
		first, err := s.Recv()
		if err != nil || len(first.Devices) != 3 {
			t.Fatalf("first message = %v, %v; want the full list", first, err)
		}
		streams = append(streams, s)
	}
	for i := range 50 {
		p.set("dev-1", i%2 == 1)
	}
	p.set("dev-1", false)
	for i, s := range streams {
		for {
			m, err := s.Recv()
			if err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
			if m.Devices[1].Health == pluginapi.Unhealthy && len(m.Devices) == 3 {
				break
			}
		}
	}
}

func TestReRegistersAfterEveryKubeletRestart(t *testing.T) {
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: newTestPlugin(8)})
	k.WaitForRegistrations(t, res, 1)
	const restarts = 100
	for i := range restarts {
		k.Restart(t)
		k.WaitForRegistrations(t, res, i+2)
		k.WaitForDevices(t, res, dptest.Healthy(8))
	}
	if got := k.Registrations(res); got != restarts+1 {
		t.Errorf("registrations = %d, want %d (one per restart, no storm)", got, restarts+1)
	}
	// One socket of this instance, no leftovers from the restarts.
	if socks, _ := filepath.Glob(filepath.Join(k.PluginDir(), "example_com_foo-*.sock")); len(socks) != 1 {
		t.Errorf("plugin sockets after %d restarts: %v, want exactly one", restarts, socks)
	}
}

// TestReRegistersWhenOwnSocketIsDeleted: a plugin whose socket is deleted
// while the kubelet is connected serves a fresh socket, registers it (a
// kubelet refuses the old path while it still holds a connection to it)
// and ends the old connection, so the kubelet is left with no stale
// endpoint.
func TestReRegistersWhenOwnSocketIsDeleted(t *testing.T) {
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: newTestPlugin(1)})
	req := k.WaitForRegistration(t, res)
	old := k.Plugin(res)
	sock := filepath.Join(k.PluginDir(), req.Endpoint)
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	k.WaitForRegistrations(t, res, 2)
	req2 := k.Plugin(res).Request
	if req2.Endpoint == req.Endpoint {
		t.Fatalf("re-registered the deleted socket's path %s; want a fresh one", req.Endpoint)
	}
	if _, err := os.Stat(filepath.Join(k.PluginDir(), req2.Endpoint)); err != nil {
		t.Errorf("new socket not served: %v", err)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Errorf("the deleted socket %s was created again", sock)
	}
	// The old connection ends: the plugin stopped its old server.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s, err := old.Client.ListAndWatch(ctx, &pluginapi.Empty{}, grpc.WaitForReady(false)); err == nil {
		for {
			if _, err = s.Recv(); err != nil {
				break
			}
		}
		if ctx.Err() != nil {
			t.Errorf("the old connection still serves ListAndWatch: %v", err)
		}
	}
	if _, err := k.Allocate(context.Background(), res, "dev-0"); err != nil {
		t.Errorf("Allocate after re-registration: %v", err)
	}
}

func TestShutdownRemovesOnlyOwnSocketsAndFinishesAllocate(t *testing.T) {
	k := dptest.NewKubelet(t)
	entered, release := make(chan struct{}), make(chan struct{})
	p := newTestPlugin(2)
	p.allocFn = func(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
		close(entered)
		<-release
		return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"OK": "1"}}, nil
	}
	// Another instance's socket, as during a rolling update.
	other := filepath.Join(k.PluginDir(), "example_com_foo-other.sock")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: k.PluginDir(), Registration: deviceplugin.RegistrationKubelet},
		deviceplugin.Resource{Name: res, Plugin: p}, deviceplugin.Resource{Name: "example.com/bar", Plugin: newTestPlugin(1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	k.WaitForDevices(t, res, dptest.Count(2))
	k.WaitForRegistration(t, "example.com/bar")
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := srv.WaitReady(wctx); err != nil {
		t.Errorf("WaitReady() = %v after both registered", err)
	}

	allocErr := make(chan error, 1)
	go func() {
		r, err := k.Allocate(context.Background(), res, "dev-0")
		if err == nil && r.Envs["OK"] != "1" {
			err = fmt.Errorf("response %v", r)
		}
		allocErr <- err
	}()
	<-entered
	cancel()
	close(release)
	if err := <-allocErr; err != nil {
		t.Errorf("in-flight Allocate: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(k.PluginDir())
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, ",") != "example_com_foo-other.sock,kubelet.sock" {
		t.Errorf("left in plugin dir: %v; want only the other instance's socket and kubelet.sock", left)
	}
}

func TestRegistryMode(t *testing.T) {
	srv, conn, ctx := runRegistryServer(t, deviceplugin.Config{}, newTestPlugin(2))
	if srv.Mode() != deviceplugin.RegistrationRegistry {
		t.Fatalf("auto mode chose %s with a registry directory present", srv.Mode())
	}
	// Act as the kubelet's plugin watcher: GetInfo, then dial the endpoint
	// and notify.
	sock := strings.TrimPrefix(conn.Target(), "unix://")
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DevicePlugin || info.Name != res || info.Endpoint != sock || info.SupportedVersions[0] != "v1beta1" {
		t.Errorf("GetInfo = %+v", info)
	}
	if err := srv.Ready(); err == nil {
		t.Error("Ready before the kubelet confirmed registration")
	}
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || len(m.Devices) != 2 {
		t.Fatalf("ListAndWatch = %v, %v", m, err)
	}
	if _, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Ready(); err != nil {
		t.Errorf("Ready() = %v after the kubelet confirmed registration", err)
	}
}

// TestRegistryModeStreamEndedByKubelet: a registered plugin whose device
// list stream the kubelet ends while the plugin still serves (kubelets
// v1.34 to v1.36 do it to the newest instance when an older one exits,
// kubernetes#121994) serves a socket of a new name, which the plugin
// watcher registers again, and removes the old one first.
func TestRegistryModeStreamEndedByKubelet(t *testing.T) {
	srv, conn, ctx := runRegistryServer(t, deviceplugin.Config{Registration: deviceplugin.RegistrationRegistry}, newTestPlugin(2))
	sock := strings.TrimPrefix(conn.Target(), "unix://")
	reg := registerapi.NewRegistrationClient(conn)
	if _, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	sctx, end := context.WithCancel(ctx)
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(sock)); err != nil {
		t.Fatal(err)
	}
	end() // the kubelet drops the client
	removed, created := false, ""
	for created == "" {
		select {
		case ev := <-w.Events:
			switch {
			case ev.Name == sock && ev.Has(fsnotify.Remove):
				removed = true
			case ev.Name != sock && ev.Has(fsnotify.Create) && strings.HasSuffix(ev.Name, ".sock"):
				if !removed {
					t.Fatalf("new socket %s served before the old one was removed", ev.Name)
				}
				created = ev.Name
			}
		case err := <-w.Errors:
			t.Fatal(err)
		case <-time.After(10 * time.Second): // a failure bound, not a synchronisation
			t.Fatal("no new socket after the kubelet ended the stream")
		}
	}
	if err := srv.Ready(); err == nil {
		t.Error("Ready() before the plugin watcher registered the new socket")
	}
	nc, err := grpc.NewClient("unix://"+created, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	info, err := registerapi.NewRegistrationClient(nc).GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil || info.Endpoint != created || info.Name != res {
		t.Fatalf("GetInfo on the new socket = %+v, %v", info, err)
	}
}

func TestNewServerReportsEveryProblem(t *testing.T) {
	_, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: "relative", Registration: "sometimes"},
		deviceplugin.Resource{Name: "foo", Plugin: newTestPlugin(1)},
		deviceplugin.Resource{Name: "example.com/bar"},
	)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"PluginDir", "Registration", `resources[0].Name: resource name "foo" must be domain-qualified`, "resources[1].Plugin"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// waitForSocket waits, with fsnotify, for one socket to appear in dir.
func waitForSocket(t *testing.T, dir string) string {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(10 * time.Second)
	for {
		if m, _ := filepath.Glob(filepath.Join(dir, "*.sock")); len(m) == 1 {
			return m[0]
		}
		select {
		case <-w.Events:
		case <-timeout:
			t.Fatal("no registration socket appeared")
		}
	}
}

// gatedPlugin reports its devices only once release is closed.
type gatedPlugin struct {
	*testPlugin
	release chan struct{}
}

func (p gatedPlugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	select {
	case <-p.release:
	case <-ctx.Done():
		return nil
	}
	return p.testPlugin.Scan(ctx, notify)
}

// TestRegistryModeNotifiedBeforeFirstScan: the plugin watcher may register
// a plugin (and say so) before the plugin's first scan is done, since the
// socket is served first. The plugin must stay registered and ready once
// its devices arrive.
func TestRegistryModeNotifiedBeforeFirstScan(t *testing.T) {
	p := gatedPlugin{testPlugin: newTestPlugin(2), release: make(chan struct{})}
	srv, conn, ctx := runRegistryServer(t, deviceplugin.Config{Registration: deviceplugin.RegistrationRegistry}, p)
	reg := registerapi.NewRegistrationClient(conn)
	if _, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if err := srv.Ready(); err != nil {
		t.Fatalf("Ready() = %v right after the watcher's notification", err)
	}
	stream, err := pluginapi.NewDevicePluginClient(conn).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	// The stream is open before the devices come: its first message
	// waits for them, not an empty list the kubelet would refuse pods for.
	waitStreams(t, srv, 1)
	close(p.release)
	if m, err := stream.Recv(); err != nil || len(m.Devices) != 2 {
		t.Fatalf("first ListAndWatch message %v, %v; want the 2 devices of the first scan", m, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := srv.WaitReady(wctx); err != nil {
		t.Fatalf("after the first scan: %v", err)
	}
	for _, st := range srv.Status() {
		if !st.Registered {
			t.Errorf("%s not registered after the first scan", st.Name)
		}
	}
}

// TestRegistryModeFirstListWaitsAtMostFirstScanWait: a plugin whose scan
// reports nothing gets its stream's first message, an empty list, once
// FirstScanWait has passed, and later streams at once.
func TestRegistryModeFirstListWaitsAtMostFirstScanWait(t *testing.T) {
	p := gatedPlugin{testPlugin: newTestPlugin(2), release: make(chan struct{})}
	_, conn, ctx := runRegistryServer(t, deviceplugin.Config{Registration: deviceplugin.RegistrationRegistry, FirstScanWait: 100 * time.Millisecond}, p)
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := stream.Recv(); err != nil || len(m.Devices) != 0 {
		t.Fatalf("first message after FirstScanWait %v, %v; want an empty list", m, err)
	}
	again, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := again.Recv(); err != nil || len(m.Devices) != 0 {
		t.Fatalf("a later stream's first message %v, %v; want the empty list at once", m, err)
	}
}

// waitStreams waits until the server's resource has n ListAndWatch
// streams open.
func waitStreams(t *testing.T, srv *deviceplugin.Server, n int) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for srv.Status()[0].Streams != n {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%d ListAndWatch streams open, want %d", srv.Status()[0].Streams, n)
		}
	}
}

// TestNotReadyOverKubeletMessageLimit: a registered plugin whose device
// list is over the kubelet's 4 MiB ListAndWatch limit is not ready, and
// says why.
func TestNotReadyOverKubeletMessageLimit(t *testing.T) {
	k := dptest.NewKubelet(t)
	p := newTestPlugin(0)
	for i := range 40000 {
		p.devs = append(p.devs, deviceplugin.Device{ID: fmt.Sprintf("%0100d", i), Healthy: true})
	}
	srv := dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: p})
	k.WaitForRegistration(t, res)
	err := srv.Ready()
	if err == nil || !strings.Contains(err.Error(), "ListAndWatch limit") {
		t.Fatalf("Ready() = %v, want an error about the kubelet's message limit", err)
	}
}

// TestStartRemovesStaleSocketsOfEarlierInstances: sockets of earlier
// instances of the same resource that nobody listens on (a crash loop
// leaves one per crash) are removed when a new instance starts; a live
// instance's socket (a rolling update) and other resources' sockets stay.
func TestStartRemovesStaleSocketsOfEarlierInstances(t *testing.T) {
	k := dptest.NewKubelet(t)
	dir := k.PluginDir()
	var stale []string
	for i := range 50 {
		path := filepath.Join(dir, fmt.Sprintf("example_com_foo-dead%02d.sock", i))
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		l.(*net.UnixListener).SetUnlinkOnClose(false)
		_ = l.Close()
		stale = append(stale, path)
	}
	live := filepath.Join(dir, "example_com_foo-live.sock")
	other := filepath.Join(dir, "example_com_bar-dead.sock")
	for _, path := range []string{live, other} {
		l, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		if path == other {
			l.(*net.UnixListener).SetUnlinkOnClose(false)
			_ = l.Close()
			continue
		}
		t.Cleanup(func() { _ = l.Close() })
	}
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: newTestPlugin(1)})
	k.WaitForRegistration(t, res)
	for _, path := range stale {
		if _, err := os.Stat(path); err == nil {
			t.Errorf("stale socket %s left behind", filepath.Base(path))
		}
	}
	for _, path := range []string{live, other} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s removed: %v", filepath.Base(path), err)
		}
	}
	if socks, _ := filepath.Glob(filepath.Join(dir, "example_com_foo-*.sock")); len(socks) != 2 {
		t.Errorf("sockets of %s: %v, want the live instance's and the new one", res, socks)
	}
}

// runRegistryServer runs a server for plugin in registry mode (a temporary
// plugins_registry directory) until the test ends, and returns it with a
// connection to its socket, as the kubelet's plugin watcher would make,
// and the context the server runs under.
func runRegistryServer(t *testing.T, cfg deviceplugin.Config, plugin deviceplugin.Plugin) (*deviceplugin.Server, *grpc.ClientConn, context.Context) {
	t.Helper()
	dir := testdir.Short(t, "dpr")
	registry := filepath.Join(dir, "plugins_registry")
	if err := os.Mkdir(registry, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg.PluginDir, cfg.RegistryDir = filepath.Join(dir, "dp"), registry
	srv, err := deviceplugin.NewServer(cfg, deviceplugin.Resource{Name: res, Plugin: plugin})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	// Run listens before it starts anything else; the socket appears
	// within Run's first steps.
	sock := waitForSocket(t, registry)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return srv, conn, ctx
}

// A plugin whose author set no PluginDir serves and registers in the
// directory $DPKIT_PLUGIN_DIR names (dpkit verify sets it); a PluginDir set
// in Config wins over it. Not parallel: it sets the environment.
func TestPluginDirFromEnvironment(t *testing.T) {
	t.Run("zero config", func(t *testing.T) {
		k := dptest.NewKubelet(t)
		t.Setenv(deviceplugin.EnvPluginDir, k.PluginDir())
		serveUntilDone(t, deviceplugin.Config{})
		k.WaitForRegistration(t, res)
	})
	t.Run("config wins", func(t *testing.T) {
		k := dptest.NewKubelet(t)
		t.Setenv(deviceplugin.EnvPluginDir, t.TempDir()) // no kubelet there
		serveUntilDone(t, deviceplugin.Config{PluginDir: k.PluginDir()})
		k.WaitForRegistration(t, res)
	})
}

// serveUntilDone runs a server of res with cfg until the test ends.
func serveUntilDone(t *testing.T, cfg deviceplugin.Config) {
	t.Helper()
	srv, err := deviceplugin.NewServer(cfg, deviceplugin.Resource{Name: res, Plugin: dptest.NewDevices("a", "b")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

// A device list that names an ID twice is refused as a whole and logged
// as an error naming the ID and both entries, once however often Scan
// sends it. Refused first, the resource registers with no devices after
// FirstScanWait; refused later, the devices accepted before stay.
func TestDuplicateDeviceIDRefused(t *testing.T) {
	dup := []deviceplugin.Device{
		{ID: "dongle0", Healthy: true, NUMANodes: []int64{0}},
		{ID: "dongle1", Healthy: true, NUMANodes: []int64{0}},
		{ID: "dongle0", Healthy: true, NUMANodes: []int64{1}},
	}
	const wantErr = `device ID \"dongle0\" is listed twice: devices[0] (healthy, NUMA nodes [0]) and devices[2] (healthy, NUMA nodes [1]); give every device its own ID`
	errorLines := func(log string) []string {
		var out []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "level=ERROR") {
				out = append(out, l)
			}
		}
		return out
	}
	t.Run("first list", func(t *testing.T) {
		k := dptest.NewKubelet(t)
		var log syncbuf.Buffer
		p := &testPlugin{ready: make(chan struct{}), devs: dup}
		dptest.ServeConfig(t, k, deviceplugin.Config{Logger: slog.New(slog.NewTextHandler(&log, nil)), FirstScanWait: 100 * time.Millisecond},
			deviceplugin.Resource{Name: res, Plugin: p})
		k.WaitForDevices(t, res, dptest.Count(0))
		lines := errorLines(log.String())
		if len(lines) != 1 || !strings.Contains(lines[0], "Device list refused") || !strings.Contains(lines[0], wantErr) {
			t.Fatalf("error log lines %q, want one refusing the list with %q", lines, wantErr)
		}
		<-p.ready
		p.mu.Lock()
		p.notify(dup) // again: not logged again as an error
		p.notify(dup[:2])
		p.mu.Unlock()
		k.WaitForDevices(t, res, dptest.Healthy(2))
		if lines := errorLines(log.String()); len(lines) != 1 {
			t.Errorf("error log lines %q, want the refusal once", lines)
		}
	})
	t.Run("later list", func(t *testing.T) {
		k := dptest.NewKubelet(t)
		var log syncbuf.Buffer
		p := newTestPlugin(2)
		dptest.ServeConfig(t, k, deviceplugin.Config{Logger: slog.New(slog.NewTextHandler(&log, nil))}, deviceplugin.Resource{Name: res, Plugin: p})
		k.WaitForDevices(t, res, dptest.Healthy(2))
		<-p.ready
		p.mu.Lock()
		p.notify(append(slices.Clone(p.devs), deviceplugin.Device{ID: "dev-2", Healthy: true}, deviceplugin.Device{ID: "dev-2", Healthy: false}))
		p.mu.Unlock()
		want := `device ID \"dev-2\" is listed twice: devices[2] (healthy, no NUMA node) and devices[3] (unhealthy, no NUMA node)`
		if lines := errorLines(log.String()); len(lines) != 1 || !strings.Contains(lines[0], want) {
			t.Fatalf("error log lines %q, want one with %q", lines, want)
		}
		// The refused list never replaced the accepted one: dev-2 is unknown.
		if _, err := k.Allocate(context.Background(), res, "dev-2"); status.Code(err) != codes.InvalidArgument {
			t.Errorf("Allocate(dev-2) after the refused list = %v, want InvalidArgument (unknown device)", err)
		}
	})
}

// GetDevicePluginOptions answers with the SDK's header, so that a tool
// such as dpkit verify can word its advice for the SDK.
func TestSDKHeader(t *testing.T) {
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, deviceplugin.Resource{Name: res, Plugin: newTestPlugin(1)})
	k.WaitForRegistration(t, res)
	var md metadata.MD
	if _, err := k.Client(t, res).GetDevicePluginOptions(context.Background(), &pluginapi.Empty{}, grpc.Header(&md)); err != nil {
		t.Fatal(err)
	}
	if got := md.Get(deviceplugin.SDKHeader); len(got) != 1 || got[0] != "pkg/deviceplugin" {
		t.Errorf("header %s = %q, want [pkg/deviceplugin]", deviceplugin.SDKHeader, got)
	}
}
