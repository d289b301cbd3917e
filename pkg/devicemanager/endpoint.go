package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/kubeletreg"
	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/pkg/topology"
)

// IsExtendedResourceName applies the kubelet's rule for resource names
// served by device plugins (package resourcename).
func IsExtendedResourceName(name string) bool { return resourcename.Valid(name) }

func versionSupported(versions ...string) bool {
	for _, v := range versions {
		for _, s := range pluginapi.SupportedVersions {
			if v == s {
				return true
			}
		}
	}
	return false
}

type registrationServer struct {
	pluginapi.UnimplementedRegistrationServer
	m *Manager
}

// Register handles a plugin's registration on kubelet.sock. The options in
// the request are ignored: GetDevicePluginOptions is asked instead.
func (s *registrationServer) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	m := s.m
	m.log.Info("Registration request from device plugin", "resource", r.ResourceName, "endpoint", r.Endpoint, "version", r.Version)
	if err := kubeletreg.CheckRequest(r.Version, r.ResourceName); err != nil {
		m.log.Error("Bad registration request", "resource", r.ResourceName, "err", err)
		return &pluginapi.Empty{}, err
	}
	if err := m.connect(ctx, r.ResourceName, filepath.Join(m.socketDir, r.Endpoint)); err != nil {
		m.log.Error("Failed to connect to device plugin", "resource", r.ResourceName, "err", err)
		return &pluginapi.Empty{}, err
	}
	return &pluginapi.Empty{}, nil
}

// PluginHandler is what a plugins_registry watcher calls for device plugins
// that register through the kubelet's plugin watcher rather than
// kubelet.sock, like the kubelet's pluginmanager cache.PluginHandler.
// pluginName is the resource name and endpoint the absolute path of the
// plugin's socket.
type PluginHandler interface {
	// ValidatePlugin checks versions and the resource name before
	// registration.
	ValidatePlugin(ctx context.Context, pluginName, endpoint string, versions []string) error
	// RegisterPlugin connects to the plugin, asks its options and starts
	// consuming ListAndWatch. It returns when the plugin is connected.
	RegisterPlugin(ctx context.Context, pluginName, endpoint string, versions []string) error
	// DeRegisterPlugin disconnects the plugin instance at endpoint only;
	// other instances serving the same resource stay connected.
	DeRegisterPlugin(ctx context.Context, pluginName, endpoint string)
}

// PluginHandler returns the handler for a plugins_registry watcher.
func (m *Manager) PluginHandler() PluginHandler { return watcherHandler{m} }

type watcherHandler struct{ m *Manager }

func (h watcherHandler) ValidatePlugin(_ context.Context, name, _ string, versions []string) error {
	if !versionSupported(versions...) {
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v", pluginapi.Version, versions)
	}
	if !IsExtendedResourceName(name) {
		return fmt.Errorf("invalid name of device plugin socket: %w", kubeletreg.InvalidResourceName(name))
	}
	return nil
}

func (h watcherHandler) RegisterPlugin(ctx context.Context, name, socket string, versions []string) error {
	if err := h.ValidatePlugin(ctx, name, socket, versions); err != nil {
		return err
	}
	return h.m.connect(ctx, name, socket)
}

func (h watcherHandler) DeRegisterPlugin(_ context.Context, name, socket string) {
	h.m.mu.Lock()
	var e *endpoint
	if r := h.m.resources[name]; r != nil {
		e = r.endpoints[socket]
	}
	h.m.mu.Unlock()
	if e != nil {
		h.m.log.Info("Deregistering device plugin", "resource", name, "endpoint", socket)
		h.m.disconnect(e)
	}
}

// endpoint is one connected plugin instance.
type endpoint struct {
	resource string
	socket   string
	conn     io.Closer // nil for a plugin in this process
	api      pluginapi.DevicePluginClient
	opts     *pluginapi.DevicePluginOptions
	cancel   context.CancelFunc
	once     sync.Once
}

func (e *endpoint) close() {
	e.once.Do(func() {
		e.cancel()
		if e.conn != nil {
			_ = e.conn.Close()
		}
	})
}

// connect dials the plugin, asks its options, records it as the resource's
// primary endpoint and starts consuming its ListAndWatch stream. Endpoints
// are keyed by resource and socket path, so a new instance of a plugin is
// not disconnected when an older one of the same resource exits.
//
// A registration of a socket that is still connected is refused with the
// kubelet's error, after GetDevicePluginOptions as in the kubelet: the
// old connection stays until its ListAndWatch stream ends. A plugin that
// re-serves the same path while the kubelet still holds the old
// connection is told so, instead of having that connection silently
// replaced (which a real kubelet never does).
func (m *Manager) connect(ctx context.Context, resource, socket string) error {
	if err := m.accepting(); err != nil {
		return err
	}

	conn, err := grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"))
	if err != nil {
		return fmt.Errorf("failed to dial device plugin: %w", err)
	}
	dctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	defer cancel()
	// The kubelet dials with a blocking dial bounded by 10 s and fails
	// with its own text before it asks for options. Both errors are plain
	// (the kubelet formats them with %v): the registering plugin sees
	// code Unknown, not the options call's status nor DeadlineExceeded,
	// which gRPC would find in a wrapped error.
	if err := unixsock.WaitReady(dctx, conn); err != nil {
		_ = conn.Close()
		return errors.New("failed to dial device plugin: " + dctx.Err().Error())
	}
	return m.attach(dctx, resource, socket, conn, pluginapi.NewDevicePluginClient(conn))
}

// accepting returns ErrNotStarted unless the manager runs and is not
// stopping.
func (m *Manager) accepting() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started || m.stopping {
		return ErrNotStarted
	}
	return nil
}

// InProcessEndpoint is the endpoint under which ConnectInProcess records
// a plugin: no socket path, since it has none.
func InProcessEndpoint(name string) string { return "in-process:" + name }

// ConnectInProcess registers a plugin that runs in this process and is
// reached through api without a socket (the SDK's
// deviceplugin.Config.InProcess): dpkit node's in-process plugins, one
// per node, thousands to a process, where each socket pair cost a gRPC
// server, a connection and a dozen goroutines. Past the socket it is a
// registration through kubelet.sock: the request is checked as Register
// checks it, GetDevicePluginOptions is asked, ListAndWatch is consumed,
// and the plugin is disconnected when that stream ends. name tells
// instances of one resource apart (InProcessEndpoint).
func (m *Manager) ConnectInProcess(ctx context.Context, resource, name string, api pluginapi.DevicePluginClient) error {
	m.log.Info("Registration request from in-process device plugin", "resource", resource, "endpoint", name)
	if err := kubeletreg.CheckRequest(pluginapi.Version, resource); err != nil {
		return err
	}
	if err := m.accepting(); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, m.cfg.DialTimeout)
	defer cancel()
	return m.attach(dctx, resource, InProcessEndpoint(name), nil, api)
}

// attach asks a reachable plugin its options, records it as the
// resource's primary endpoint and starts consuming its ListAndWatch
// stream. conn, when not nil, is closed with the endpoint.
func (m *Manager) attach(ctx context.Context, resource, socket string, conn io.Closer, api pluginapi.DevicePluginClient) error {
	closeConn := func() {
		if conn != nil {
			_ = conn.Close()
		}
	}
	opts, err := api.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil {
		closeConn()
		return errors.New("failed to get device plugin options: " + err.Error())
	}

	sctx, scancel := context.WithCancel(m.ctx)
	e := &endpoint{resource: resource, socket: socket, conn: conn, api: api, opts: opts, cancel: scancel}
	m.mu.Lock()
	if !m.started || m.stopping {
		m.mu.Unlock()
		e.close()
		return ErrNotStarted
	}
	r := m.resources[resource]
	if r == nil {
		r = newResourceState(resource)
		m.resources[resource] = r
	}
	if prev := r.endpoints[socket]; prev != nil {
		m.mu.Unlock()
		e.close()
		return kubeletreg.AlreadyConnected(socket)
	}
	r.endpoints[socket] = e
	r.primary = e
	r.opts = opts
	r.stopTime = timeZero
	m.notifyLocked()
	m.wg.Add(1)
	m.mu.Unlock()
	m.log.Info("Device plugin connected", "resource", resource, "endpoint", socket,
		"preStartRequired", opts.GetPreStartRequired(), "getPreferredAllocationAvailable", opts.GetGetPreferredAllocationAvailable())

	if p, ok := api.(pushingClient); ok {
		m.watchPushed(sctx, e, p)
		return nil
	}
	go func() {
		defer m.wg.Done()
		m.run(sctx, e)
		m.disconnect(e)
	}()
	return nil
}

// watchPushed applies each list an in-process plugin pushes, on the
// plugin's goroutine: no goroutine waits on its stream. Its end, the
// plugin's (ended) or ctx's (the manager disconnected it), is run's and
// disconnect's, once.
func (m *Manager) watchPushed(ctx context.Context, e *endpoint, p pushingClient) {
	var once sync.Once
	end := func(err error) {
		once.Do(func() {
			m.streamEnded(ctx, e, err)
			m.disconnect(e)
			m.wg.Done()
		})
	}
	stop := p.WatchDevices(func(resp *pluginapi.ListAndWatchResponse) error {
		m.applyDevices(e, resp.Devices)
		return nil
	}, end)
	// A goroutine only once ctx ends, not while it waits.
	context.AfterFunc(ctx, func() {
		stop()
		end(ctx.Err())
	})
}

// run consumes the plugin's ListAndWatch stream until it ends.
func (m *Manager) run(ctx context.Context, e *endpoint) {
	m.streamEnded(ctx, e, m.listAndWatch(ctx, e))
}

// streamEnded logs what ended the plugin's ListAndWatch stream.
func (m *Manager) streamEnded(ctx context.Context, e *endpoint, err error) {
	switch {
	case ctx.Err() != nil:
		// the manager disconnected it
	case errors.Is(err, io.EOF):
		// The plugin returned from ListAndWatch: it is stopping (the
		// SDK ends its streams so on shutdown), which is no failure.
		// A plugin that dies or drops the connection ends the stream
		// with an error status instead.
		m.log.Info("Device plugin ended its ListAndWatch stream", "resource", e.resource, "endpoint", e.socket)
	default:
		m.log.Error("ListAndWatch ended", "resource", e.resource, "endpoint", e.socket, "err", err)
	}
}

// pushingClient is a plugin client that hands each list of its
// ListAndWatch to a callback on the plugin's goroutine, none waiting on
// the stream (an in-process plugin's, deviceplugin.InProcessClient).
type pushingClient interface {
	WatchDevices(send func(*pluginapi.ListAndWatchResponse) error, ended func(error)) (stop func())
}

// listAndWatch applies each list the plugin's stream carries and returns
// what ended it (io.EOF when the plugin returned).
func (m *Manager) listAndWatch(ctx context.Context, e *endpoint) error {
	stream, err := e.api.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("ListAndWatch failed: %w", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		m.applyDevices(e, resp.Devices)
	}
}

// disconnect forgets e. When it was the resource's last plugin, every
// device of the resource becomes unhealthy and the grace period starts.
func (m *Manager) disconnect(e *endpoint) {
	e.close()
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resources[e.resource]
	if r == nil || r.endpoints[e.socket] != e {
		return
	}
	delete(r.endpoints, e.socket)
	if m.stopping {
		return
	}
	if len(r.endpoints) > 0 {
		if r.primary == e {
			for _, k := range sortedKeys(r.endpoints) {
				r.primary = r.endpoints[k]
				r.opts = r.primary.opts
				break
			}
		}
		m.notifyLocked()
		m.log.Info("Device plugin instance disconnected; others still serve the resource", "resource", e.resource, "endpoint", e.socket)
		return
	}
	r.primary = nil
	r.stopTime = m.cfg.Clock.Now()
	m.markUnhealthyLocked(r)
	m.notifyLocked()
	m.wakeGCLocked()
	m.log.Info("Last device plugin of the resource disconnected; devices are unhealthy until it returns", "resource", e.resource, "endpoint", e.socket, "gracePeriod", m.cfg.GracePeriod)
}

func newResourceState(name string) *resourceState {
	return &resourceState{
		name:      name,
		devices:   make(map[string]*device),
		free:      make(map[topology.Mask]*pool),
		groups:    make(topology.DeviceGroups),
		endpoints: make(map[string]*endpoint),
	}
}
