package dramanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstats "google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/dpkit/dpkit/pkg/pluginwatcher"
)

// Services is every DRAPlugin gRPC service the manager speaks, newest
// first; a driver lists the ones it serves in GetInfo's versions.
var Services = []string{drav1.DRAPluginService, drav1beta1.DRAPluginService}

// HealthServices is every DRAResourceHealth gRPC service the manager
// speaks, newest first. v1alpha1 is read until Kubernetes 1.40.
var HealthServices = []string{drahealthv1.DRAResourceHealthService, drahealthv1alpha1.DRAResourceHealthService}

// ErrNotRegistered is wrapped by errors about a driver that has no
// registered plugin.
var ErrNotRegistered = errors.New("DRA driver is not registered")

// Plugin is one registered plugin of a DRA driver, as Plugins reports it.
type Plugin struct {
	Driver   string `json:"driver"`
	Endpoint string `json:"endpoint"`
	// Service and HealthService are the negotiated gRPC services; the
	// latter is empty when the driver serves no health.
	Service       string `json:"service"`
	HealthService string `json:"healthService,omitempty"`
	// Connected tells whether the gRPC connection to the plugin is up.
	Connected bool `json:"connected"`
}

// plugin is a registered plugin with its one gRPC connection, shared by
// the node service and the health stream (the kubelet's e2e "must reuse
// one gRPC connection").
type plugin struct {
	Plugin
	conn         *grpc.ClientConn
	cancelHealth context.CancelFunc
	m            *Manager
}

// plugins holds the registered plugins of every driver, oldest first:
// during a rolling update a driver has two.
type plugins struct {
	mu    sync.Mutex
	store map[string][]*plugin
}

// handler is the manager's pluginwatcher.Handler.
type handler struct{ m *Manager }

var _ pluginwatcher.Handler = handler{}

// PluginHandler returns the handler to register in the plugin watcher
// under pluginwatcher.DRAPlugin.
func (m *Manager) PluginHandler() pluginwatcher.Handler { return handler{m} }

// chooseService picks the DRAPlugin service to call: the first of the
// driver's list the manager speaks, as the kubelet does (drivers list
// the newest first).
func chooseService(driver string, services []string) (string, error) {
	if len(services) == 0 {
		return "", errors.New("empty list of supported gRPC services (aka supported versions)")
	}
	for _, s := range services {
		if slices.Contains(Services, s) {
			return s, nil
		}
	}
	return "", fmt.Errorf("none of services supported by the plugin (%q) are supported by the kubelet (%q); serve %s", services, Services, drav1.DRAPluginService)
}

// chooseHealthService picks the newest health service the manager and
// the driver both speak, or "" when the driver serves none.
func chooseHealthService(services []string) string {
	for _, s := range HealthServices {
		if slices.Contains(services, s) {
			return s
		}
	}
	return ""
}

func (h handler) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	if _, err := chooseService(name, versions); err != nil {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err)
	}
	return nil
}

func (h handler) RegisterPlugin(_ context.Context, name, endpoint string, versions []string) error {
	svc, err := chooseService(name, versions)
	if err != nil {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err)
	}
	return h.m.addPlugin(name, endpoint, svc, chooseHealthService(versions))
}

func (h handler) DeRegisterPlugin(_ context.Context, name, endpoint string) {
	h.m.removePlugin(name, endpoint)
}

func (m *Manager) addPlugin(driver, endpoint, svc, healthSvc string) error {
	m.plugins.mu.Lock()
	defer m.plugins.mu.Unlock()
	if m.ctx == nil || m.ctx.Err() != nil {
		return errors.New("the DRA manager is not running")
	}
	for _, old := range m.plugins.store[driver] {
		if old.Endpoint == endpoint {
			// One plugin instance cannot hijack the endpoint of another.
			return fmt.Errorf("endpoint %s already registered for DRA driver plugin %s", endpoint, driver)
		}
	}
	p := &plugin{Plugin: Plugin{Driver: driver, Endpoint: endpoint, Service: svc, HealthService: healthSvc}, m: m}
	// One connection, created once; gRPC connects on demand and the
	// stats handler tells when it is up or down.
	conn, err := grpc.NewClient("unix:"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(p),
		grpc.WithChainUnaryInterceptor(m.metrics.interceptor(m, driver)))
	if err != nil {
		return fmt.Errorf("create gRPC connection to DRA driver %s plugin at endpoint %s: %w", driver, endpoint, err)
	}
	p.conn = conn
	if healthSvc != "" {
		ctx, cancel := context.WithCancel(m.ctx)
		p.cancelHealth = cancel
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.watchHealth(ctx, p)
		}()
	}
	conn.Connect()
	if m.plugins.store == nil {
		m.plugins.store = make(map[string][]*plugin)
	}
	m.plugins.store[driver] = append(m.plugins.store[driver], p)
	m.syncWipeLocked(driver)
	m.pluginsChanged.Broadcast()
	m.log.Info("Registered DRA plugin", "driver", driver, "endpoint", endpoint, "service", svc, "healthService", healthSvc, "plugins", len(m.plugins.store[driver]))
	return nil
}

func (m *Manager) removePlugin(driver, endpoint string) {
	m.plugins.mu.Lock()
	list := m.plugins.store[driver]
	i := slices.IndexFunc(list, func(p *plugin) bool { return p.Endpoint == endpoint })
	if i < 0 {
		m.plugins.mu.Unlock()
		return
	}
	p := list[i]
	if len(list) == 1 {
		delete(m.plugins.store, driver)
	} else {
		m.plugins.store[driver] = slices.Delete(list, i, i+1)
	}
	left := len(m.plugins.store[driver])
	m.syncWipeLocked(driver)
	m.plugins.mu.Unlock()
	// Outside the lock: closing the connection calls HandleConn.
	p.close()
	m.pluginsChanged.Broadcast()
	m.log.Info("Unregistered DRA plugin", "driver", driver, "endpoint", endpoint, "plugins", left)
}

func (p *plugin) close() {
	if p.cancelHealth != nil {
		p.cancelHealth()
	}
	_ = p.conn.Close()
}

// getPlugin returns the plugin to call for driver: the newest connected
// one, else the newest (the kubelet's heuristic: after a restart plugins
// register in any order).
func (m *Manager) getPlugin(driver string) (*plugin, error) {
	if driver == "" {
		return nil, errors.New("DRA driver name is empty")
	}
	m.plugins.mu.Lock()
	defer m.plugins.mu.Unlock()
	list := m.plugins.store[driver]
	if len(list) == 0 {
		// The kubelet's words, without repeating ErrNotRegistered's.
		return nil, &reasonError{reason: ErrNotRegistered, msg: fmt.Sprintf("DRA driver %s is not registered", driver)}
	}
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].Connected {
			return list[i], nil
		}
	}
	return list[len(list)-1], nil
}

// PluginsChanged is closed at the next registration, deregistration or
// change of a plugin's connection.
func (m *Manager) PluginsChanged() <-chan struct{} { return m.pluginsChanged.C() }

// Plugins returns the registered plugins, by driver, oldest first.
func (m *Manager) Plugins() []Plugin {
	m.plugins.mu.Lock()
	defer m.plugins.mu.Unlock()
	var out []Plugin
	drivers := make([]string, 0, len(m.plugins.store))
	for d := range m.plugins.store {
		drivers = append(drivers, d)
	}
	slices.Sort(drivers)
	for _, d := range drivers {
		for _, p := range m.plugins.store[d] {
			out = append(out, p.Plugin)
		}
	}
	return out
}

// closePlugins closes every plugin's connection; Stop calls it.
func (m *Manager) closePlugins() {
	m.plugins.mu.Lock()
	var all []*plugin
	for _, list := range m.plugins.store {
		all = append(all, list...)
	}
	m.plugins.store = nil
	m.plugins.mu.Unlock()
	for _, p := range all {
		p.close()
	}
}

// TagRPC, HandleRPC and TagConn implement grpcstats.Handler; only
// HandleConn matters.
func (p *plugin) TagRPC(ctx context.Context, _ *grpcstats.RPCTagInfo) context.Context { return ctx }
func (p *plugin) HandleRPC(context.Context, grpcstats.RPCStats)                       {}
func (p *plugin) TagConn(ctx context.Context, _ *grpcstats.ConnTagInfo) context.Context {
	return ctx
}

// HandleConn records whether the connection is up. When it goes down it
// asks gRPC to reconnect (in a goroutine: gRPC deadlocks when Connect is
// called from inside HandleConn), or a restarted plugin would go
// unnoticed until the next call.
func (p *plugin) HandleConn(_ context.Context, s grpcstats.ConnStats) {
	var up bool
	switch s.(type) {
	case *grpcstats.ConnBegin:
		up = true
	case *grpcstats.ConnEnd:
		go p.conn.Connect()
	default:
		return
	}
	p.m.plugins.mu.Lock()
	p.Connected = up
	if p.m.registeredLocked(p) {
		p.m.syncWipeLocked(p.Driver)
	}
	p.m.plugins.mu.Unlock()
	p.m.pluginsChanged.Broadcast()
	p.m.log.Debug("DRA plugin connection changed", "driver", p.Driver, "endpoint", p.Endpoint, "connected", up)
}

// client calls p in the negotiated services.
func (p *plugin) client() Client { return NewClient(p.conn, p.Service, p.HealthService) }

// prepare calls NodePrepareResources in the negotiated version.
func (p *plugin) prepare(ctx context.Context, req *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, p.m.cfg.CallTimeout)
	defer cancel()
	return p.client().NodePrepareResources(ctx, req)
}

// unprepare calls NodeUnprepareResources in the negotiated version.
func (p *plugin) unprepare(ctx context.Context, req *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, p.m.cfg.CallTimeout)
	defer cancel()
	return p.client().NodeUnprepareResources(ctx, req)
}

// watchResources opens the health stream in the negotiated version.
func (p *plugin) watchResources(ctx context.Context) (drahealthv1.DRAResourceHealth_NodeWatchResourcesClient, error) {
	return p.client().NodeWatchResources(ctx)
}

// unimplemented tells whether err says the driver does not serve health.
func unimplemented(err error) bool { return status.Code(err) == codes.Unimplemented }

// registeredLocked tells whether p is still one of its driver's
// registered plugins (a closed plugin's connection reports its end).
func (m *Manager) registeredLocked(p *plugin) bool {
	return slices.Contains(m.plugins.store[p.Driver], p)
}
