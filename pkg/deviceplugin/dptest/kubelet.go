// Package dptest is a test kit for device plugin authors, in the spirit of
// net/http/httptest: an in-process fake kubelet registration endpoint in a
// temporary directory that records registrations, keeps a ListAndWatch
// stream open to every registered plugin, calls Allocate and the other
// RPCs, and can simulate a kubelet restart.
//
//	k := dptest.NewKubelet(t)
//	dptest.Serve(t, k, deviceplugin.Resource{Name: "example.com/foo", Plugin: myPlugin})
//	devs := k.WaitForDevices(t, "example.com/foo", dptest.Count(8))
//	resp, err := k.Allocate(ctx, "example.com/foo", "dev-0")
//
// The fake checks what the kubelet checks at registration (API version and
// resource name) and dials the plugin the way the kubelet does. It is not a
// device manager: it does no accounting or admission (pkg/devicemanager
// does).
package dptest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/kubeletreg"
	"github.com/dpkit/dpkit/internal/unixsock"
)

// DefaultTimeout bounds every Wait* call unless Kubelet.Timeout is set.
const DefaultTimeout = 10 * time.Second

// Kubelet is a fake kubelet registration endpoint.
type Kubelet struct {
	// Timeout bounds every Wait* call. Default DefaultTimeout.
	Timeout time.Duration

	dir  string
	sock string

	mu       sync.Mutex
	server   *grpc.Server
	plugins  map[string]*Plugin // resource -> latest registration
	bySocket map[string]*Plugin // socket path -> latest registration
	conns    []*grpc.ClientConn // every plugin connection since the last restart
	regs     map[string]int
	changed  broadcast.Change
	restarts int
	closed   bool
}

// Plugin is what the fake kubelet knows of one registered plugin.
type Plugin struct {
	Request *pluginapi.RegisterRequest
	Options *pluginapi.DevicePluginOptions
	Client  pluginapi.DevicePluginClient

	devices []*pluginapi.Device
	updates int
	ended   bool
}

// NewKubelet starts a fake kubelet in a new temporary directory, removed
// when the test ends. The directory path is kept short: unix socket paths
// are limited to 108 bytes.
func NewKubelet(t testing.TB) *Kubelet {
	t.Helper()
	dir, err := os.MkdirTemp("", "dpt")
	if err != nil {
		t.Fatalf("dptest: %v", err)
	}
	k := &Kubelet{
		dir:      dir,
		sock:     filepath.Join(dir, "kubelet.sock"),
		plugins:  make(map[string]*Plugin),
		bySocket: make(map[string]*Plugin),
		regs:     make(map[string]int),
	}
	if err := k.start(); err != nil {
		_ = os.RemoveAll(dir)
		t.Fatalf("dptest: %v", err)
	}
	t.Cleanup(func() {
		k.Close()
		_ = os.RemoveAll(dir)
	})
	return k
}

// PluginDir is the device plugin directory plugins should use.
func (k *Kubelet) PluginDir() string { return k.dir }

// SocketPath is the path of the fake kubelet.sock.
func (k *Kubelet) SocketPath() string { return k.sock }

func (k *Kubelet) start() error {
	ln, err := unixsock.Listen(k.sock)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", k.sock, err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, registration{k: k})
	k.mu.Lock()
	k.server = srv
	k.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// Close stops the fake kubelet and drops every plugin connection.
func (k *Kubelet) Close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	srv := k.server
	conns := k.dropConnsLocked()
	k.mu.Unlock()
	srv.Stop()
	closeAll(conns)
}

// dropConnsLocked forgets every plugin and returns the connections to close.
func (k *Kubelet) dropConnsLocked() []*grpc.ClientConn {
	conns := k.conns
	k.conns = nil
	k.plugins = map[string]*Plugin{}
	k.bySocket = map[string]*Plugin{}
	return conns
}

func closeAll(conns []*grpc.ClientConn) {
	for _, c := range conns {
		_ = c.Close()
	}
}

// Restart simulates a kubelet restart the way the kubelet does it: the
// registration server stops, every plugin connection drops, every socket in
// the directory is removed, then kubelet.sock is created again.
func (k *Kubelet) Restart(t testing.TB) {
	t.Helper()
	k.mu.Lock()
	srv := k.server
	conns := k.dropConnsLocked()
	k.restarts++
	k.mu.Unlock()
	srv.Stop()
	closeAll(conns)
	entries, err := os.ReadDir(k.dir)
	if err != nil {
		t.Fatalf("dptest: restart: %v", err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeSocket != 0 {
			_ = os.Remove(filepath.Join(k.dir, e.Name()))
		}
	}
	if err := k.start(); err != nil {
		t.Fatalf("dptest: restart: %v", err)
	}
	k.broadcast()
}

// Registrations returns how many times resource has registered.
func (k *Kubelet) Registrations(resource string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.regs[resource]
}

// Plugin returns the latest registration of resource, or nil.
func (k *Kubelet) Plugin(resource string) *Plugin {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.plugins[resource]
}

func (k *Kubelet) broadcast() { k.changed.Broadcast() }

// waitFor calls cond under the lock after every change until it returns
// true or the timeout passes.
func (k *Kubelet) waitFor(what string, cond func() bool) error {
	timeout := k.Timeout
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := k.changed.C()
		k.mu.Lock()
		ok := cond()
		k.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("dptest: timed out after %s waiting for %s", timeout, what)
		}
	}
}

// WaitForRegistration waits until resource has registered at least once
// since the last restart and returns its request.
func (k *Kubelet) WaitForRegistration(t testing.TB, resource string) *pluginapi.RegisterRequest {
	t.Helper()
	var req *pluginapi.RegisterRequest
	err := k.waitFor(resource+" to register", func() bool {
		if p := k.plugins[resource]; p != nil {
			req = p.Request
			return true
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// WaitForRegistrations waits until resource has registered n times in all.
func (k *Kubelet) WaitForRegistrations(t testing.TB, resource string, n int) {
	t.Helper()
	if err := k.waitFor(fmt.Sprintf("%d registrations of %s", n, resource), func() bool {
		return k.regs[resource] >= n && k.plugins[resource] != nil
	}); err != nil {
		t.Fatal(err)
	}
}

// WaitForDevices waits until the latest ListAndWatch message of resource
// satisfies cond and returns it.
func (k *Kubelet) WaitForDevices(t testing.TB, resource string, cond func([]*pluginapi.Device) bool) []*pluginapi.Device {
	t.Helper()
	var devs []*pluginapi.Device
	err := k.waitFor("devices of "+resource, func() bool {
		p := k.plugins[resource]
		if p == nil || p.updates == 0 {
			return false
		}
		devs = p.devices
		return cond(devs)
	})
	if err != nil {
		t.Fatalf("%v; last devices: %v", err, deviceSummary(devs))
	}
	return devs
}

// Client returns a client for resource's latest registration, failing the
// test if it has not registered.
func (k *Kubelet) Client(t testing.TB, resource string) pluginapi.DevicePluginClient {
	t.Helper()
	p := k.Plugin(resource)
	if p == nil {
		t.Fatalf("dptest: %s is not registered", resource)
	}
	return p.Client
}

// Allocate asks resource's plugin for one container with the given IDs.
func (k *Kubelet) Allocate(ctx context.Context, resource string, ids ...string) (*pluginapi.ContainerAllocateResponse, error) {
	p := k.Plugin(resource)
	if p == nil {
		return nil, fmt.Errorf("dptest: %s is not registered", resource)
	}
	resp, err := p.Client.Allocate(ctx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}},
	})
	if err != nil {
		return nil, err
	}
	if n := len(resp.ContainerResponses); n != 1 {
		return nil, fmt.Errorf("dptest: Allocate for 1 container returned %d responses", n)
	}
	return resp.ContainerResponses[0], nil
}

type registration struct {
	pluginapi.UnimplementedRegistrationServer
	k *Kubelet
}

func (r registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	if err := kubeletreg.CheckRequest(req.Version, req.ResourceName); err != nil {
		return nil, err
	}
	k := r.k
	socket := filepath.Join(k.dir, req.Endpoint)
	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"))
	if err != nil {
		return nil, fmt.Errorf("dial plugin %s: %w", socket, err)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts, err := client.GetDevicePluginOptions(octx, &pluginapi.Empty{}, grpc.WaitForReady(true))
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("GetDevicePluginOptions of %s: %w", req.ResourceName, err)
	}
	p := &Plugin{Request: req, Options: opts, Client: client}
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		_ = conn.Close()
		return nil, errors.New("dptest: kubelet is closed")
	}
	// Like the kubelet, a socket it is still connected to cannot
	// register again until that connection's stream has ended.
	if q := k.bySocket[socket]; q != nil && !q.ended {
		k.mu.Unlock()
		_ = conn.Close()
		return nil, kubeletreg.AlreadyConnected(socket)
	}
	k.bySocket[socket] = p
	k.regs[req.ResourceName]++
	k.plugins[req.ResourceName] = p
	// Like the kubelet, an earlier connection of the same resource stays
	// open until the plugin or a restart ends it.
	k.conns = append(k.conns, conn)
	k.mu.Unlock()
	k.broadcast()
	go k.watch(p)
	return &pluginapi.Empty{}, nil
}

// watch keeps a ListAndWatch stream open to p, like the kubelet.
func (k *Kubelet) watch(p *Plugin) {
	stream, err := p.Client.ListAndWatch(context.Background(), &pluginapi.Empty{})
	for err == nil {
		var resp *pluginapi.ListAndWatchResponse
		resp, err = stream.Recv()
		if err != nil {
			break
		}
		k.mu.Lock()
		p.devices = resp.Devices
		p.updates++
		k.mu.Unlock()
		k.broadcast()
	}
	k.mu.Lock()
	p.ended = true
	k.mu.Unlock()
	k.broadcast()
}

func deviceSummary(devs []*pluginapi.Device) string {
	healthy := 0
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			healthy++
		}
	}
	return fmt.Sprintf("%d devices, %d healthy", len(devs), healthy)
}
