package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// stubPlugin is a minimal device plugin served on a real unix socket.
type stubPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	t        testing.TB
	resource string
	socket   string
	opts     *pluginapi.DevicePluginOptions
	server   *grpc.Server
	done     chan struct{}
	ending   chan struct{} // closed: ListAndWatch returns, as a plugin that stops cleanly does
	endOnce  sync.Once

	mu       sync.Mutex
	devices  []*pluginapi.Device
	updates  chan struct{}
	allocate func(ids []string) (*pluginapi.AllocateResponse, error)
	prefer   func(req *pluginapi.ContainerPreferredAllocationRequest) []string
	calls    []string // "Allocate:ids", "PreStart:ids", "Preferred:size"
	preStart func(ids []string) error
}

func newStub(t testing.TB, dir, resource, sockName string, opts *pluginapi.DevicePluginOptions, devs []*pluginapi.Device) *stubPlugin {
	t.Helper()
	if opts == nil {
		opts = &pluginapi.DevicePluginOptions{}
	}
	p := &stubPlugin{t: t, resource: resource, socket: filepath.Join(dir, sockName), opts: opts, devices: devs, updates: make(chan struct{}, 1), done: make(chan struct{}), ending: make(chan struct{})}
	ln, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	p.server = grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() {
		defer close(p.done)
		_ = p.server.Serve(ln)
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *stubPlugin) stop() {
	p.server.Stop()
	<-p.done
}

// endStreams ends every ListAndWatch stream from the plugin's side, as
// a plugin that stops cleanly does; the server keeps serving.
func (p *stubPlugin) endStreams() { p.endOnce.Do(func() { close(p.ending) }) }

func (p *stubPlugin) register(t testing.TB, kubeletSock string) {
	t.Helper()
	if err := p.registerErr(t, kubeletSock); err != nil {
		t.Fatalf("Register: %v", err)
	}
}

func (p *stubPlugin) setDevices(devs []*pluginapi.Device) {
	p.mu.Lock()
	p.devices = devs
	p.mu.Unlock()
	select {
	case p.updates <- struct{}{}:
	default:
	}
}

func (p *stubPlugin) record(s string) {
	p.mu.Lock()
	p.calls = append(p.calls, s)
	p.mu.Unlock()
}

func (p *stubPlugin) Calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.calls...)
}

func (p *stubPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.opts, nil
}

func (p *stubPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devs := p.devices
		p.mu.Unlock()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-p.updates:
		case <-s.Context().Done():
			return nil
		case <-p.ending:
			return nil
		}
	}
}

func (p *stubPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	ids := req.ContainerRequests[0].DevicesIds
	p.record(fmt.Sprint("Allocate:", ids))
	p.mu.Lock()
	f := p.allocate
	p.mu.Unlock()
	if f != nil {
		return f(ids)
	}
	return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{
		Envs: map[string]string{"DEVICES_" + envName(p.resource): fmt.Sprint(ids)},
	}}}, nil
}

func (p *stubPlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	cr := req.ContainerRequests[0]
	p.record(fmt.Sprint("Preferred:", cr.AllocationSize, cr.MustIncludeDeviceIDs))
	var ids []string
	if p.prefer != nil {
		ids = p.prefer(cr)
	}
	return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: ids}}}, nil
}

func (p *stubPlugin) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p.record(fmt.Sprint("PreStart:", req.DevicesIds))
	if p.preStart != nil {
		if err := p.preStart(req.DevicesIds); err != nil {
			return nil, err
		}
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

func envName(r string) string {
	out := []byte(r)
	for i, c := range out {
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			out[i] = '_'
		}
	}
	return string(out)
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

func startManager(t testing.TB, cfg Config) *Manager {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	return m
}

// waitFor waits until cond holds, re-checking on every manager
// notification, and fails after a deadline.
func waitFor(t testing.TB, m *Manager, what string, cond func() bool) {
	t.Helper()
	ch, cancel := m.Subscribe()
	defer cancel()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for !cond() {
		select {
		case _, ok := <-ch:
			if !ok {
				t.Fatalf("manager stopped while waiting for %s", what)
			}
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func allocatable(m *Manager, rn string) int64 {
	_, a := m.Capacity()
	return a[rn]
}

func devs(ids ...string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		out[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	}
	return out
}

func numaDevs(perNode map[int64][]string) []*pluginapi.Device {
	var out []*pluginapi.Device
	for n, ids := range perNode {
		for _, id := range ids {
			out = append(out, &pluginapi.Device{ID: id, Health: pluginapi.Healthy, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: n}}}})
		}
	}
	return out
}

type ctr struct {
	name      string
	req       map[string]int64
	init      bool
	restartOK bool // restartable init container (sidecar)
}

func makePod(uid string, ctrs ...ctr) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "default", UID: types.UID(uid)}}
	always := corev1.ContainerRestartPolicyAlways
	for _, c := range ctrs {
		rl := corev1.ResourceList{}
		for r, n := range c.req {
			rl[corev1.ResourceName(r)] = *resource.NewQuantity(n, resource.DecimalSI)
		}
		k := corev1.Container{Name: c.name, Resources: corev1.ResourceRequirements{Limits: rl, Requests: rl}}
		if c.restartOK {
			k.RestartPolicy = &always
		}
		if c.init {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, k)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, k)
		}
	}
	return pod
}

func containerIDs(pa *PodAllocation, container, rn string) []string {
	if pa == nil {
		return nil
	}
	for _, c := range pa.Containers {
		if c.Name != container {
			continue
		}
		for _, r := range c.Resources {
			if r.Resource == rn {
				return r.DeviceIDs
			}
		}
	}
	return nil
}

var errBoom = errors.New("boom")

type corev1Pod = corev1.Pod

type grpcConn = grpc.ClientConnInterface

func dialForTest(sock string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func netListenUnix(path string) (*net.UnixListener, error) {
	return net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
}

func mkdirAll(p string) error { return os.MkdirAll(p, 0o750) }
