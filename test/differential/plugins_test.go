package differential

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// dev is one device a scripted plugin lists.
type dev struct {
	id     string
	health string // pluginapi.Healthy, pluginapi.Unhealthy or anything a raw plugin sends
	numa   []int64
}

func healthy(ids ...string) []dev {
	out := make([]dev, len(ids))
	for i, id := range ids {
		out[i] = dev{id: id, health: pluginapi.Healthy}
	}
	return out
}

// Registration paths.
const (
	viaKubelet  = "kubelet"  // Register on <plugin-dir>/kubelet.sock
	viaRegistry = "registry" // a socket in plugins_registry, found by the plugin watcher
)

// pluginDef describes a scripted plugin; the same definition starts one
// instance per side.
type pluginDef struct {
	name     string // the scenario's handle
	resource string
	devices  []dev
	via      string
	// sdk plugins are deviceplugin.Server instances with a scripted
	// device source: they register, re-register after kubelet restarts
	// and serve on their own. raw plugins are gRPC servers the scenario
	// drives step by step, and can misbehave.
	sdk bool
	// instance is the SDK's InstanceID, or the raw plugin's socket name
	// (without .sock). Default: name.
	instance    string
	noPreferred bool // GetPreferredAllocationAvailable false
	preStart    bool // PreStartRequired
	// Raw plugins only.
	version       string // registration API version; default v1beta1
	holdList      bool   // ListAndWatch sends nothing until releaseList
	allocateError string // Allocate fails with codes.Internal and this text
	emptyAllocate bool   // the first Allocate answers no container responses
}

func (d pluginDef) socketName() string {
	if d.instance != "" {
		return d.instance
	}
	return d.name
}

// plugin is one running instance of a scripted plugin on one side.
type plugin interface {
	setDevices([]dev)
	stop()
	// calls returns, and forgets, the Allocate, GetPreferredAllocation and
	// PreStartContainer calls seen since the last call.
	calls() []string
}

// recorder keeps the calls a plugin saw, in order.
type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

func (r *recorder) calls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.log
	r.log = nil
	return out
}

// allocResponse is every scripted plugin's answer for ids of resource: one
// of each kind of runtime option, all derived from the sorted IDs.
func allocResponse(resource string, ids []string) *pluginapi.ContainerAllocateResponse {
	ids = slices.Sorted(slices.Values(ids))
	short := path.Base(resource)
	key := strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(short))
	resp := &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"DEVICES_" + key: strings.Join(ids, ",")},
		Annotations: map[string]string{resource + "-devices": strings.Join(ids, ",")},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/run/" + short, HostPath: "/var/run/fake/" + short, ReadOnly: true}},
	}
	for _, id := range ids {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + short + "/" + id, HostPath: "/dev/fake-" + short + "-" + id, Permissions: "rw"})
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: resource + "=" + id})
	}
	return resp
}

// preferred is every scripted plugin's GetPreferredAllocation: the IDs
// that must be included, then the smallest other available IDs.
func preferred(available, mustInclude []string, size int) []string {
	out := slices.Clone(mustInclude)
	for _, id := range slices.Sorted(slices.Values(available)) {
		if len(out) >= size {
			break
		}
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

func sortedList(ids []string) string {
	return "[" + strings.Join(slices.Sorted(slices.Values(ids)), " ") + "]"
}

// sdkPlugin is a deviceplugin.Server serving one resource whose devices
// the scenario sets.
type sdkPlugin struct {
	def     pluginDef
	rec     recorder
	metrics *prometheus.Registry
	srv     *deviceplugin.Server

	mu   sync.Mutex
	devs []deviceplugin.Device
	wake chan struct{}

	cancel context.CancelFunc
	done   chan error
}

func startSDKPlugin(s *side, def pluginDef, log *slog.Logger) (*sdkPlugin, error) {
	p := &sdkPlugin{def: def, metrics: prometheus.NewRegistry(), wake: make(chan struct{}, 1), done: make(chan error, 1)}
	p.devs = sdkDevices(def.devices)
	mode := deviceplugin.RegistrationKubelet
	if def.via == viaRegistry {
		mode = deviceplugin.RegistrationRegistry
	}
	var impl deviceplugin.Plugin = sdkBase{p}
	switch {
	case !def.noPreferred && def.preStart:
		impl = sdkPreferredPreStart{sdkPreferred{sdkBase{p}}}
	case !def.noPreferred:
		impl = sdkPreferred{sdkBase{p}}
	case def.preStart:
		impl = sdkPreStart{sdkBase{p}}
	}
	srv, err := deviceplugin.NewServer(deviceplugin.Config{
		PluginDir:    s.pluginDir,
		RegistryDir:  s.registryDir,
		Registration: mode,
		InstanceID:   def.socketName(),
		Logger:       log.With("plugin", def.name),
		Registerer:   p.metrics,
		RetryMin:     20 * time.Millisecond,
		RetryMax:     time.Second,
	}, deviceplugin.Resource{Name: def.resource, Plugin: impl})
	if err != nil {
		return nil, err
	}
	p.srv = srv
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	go func() { p.done <- srv.Run(ctx) }()
	return p, nil
}

func sdkDevices(devs []dev) []deviceplugin.Device {
	out := make([]deviceplugin.Device, len(devs))
	for i, d := range devs {
		out[i] = deviceplugin.Device{ID: d.id, Healthy: d.health == pluginapi.Healthy, NUMANodes: d.numa}
	}
	return out
}

func (p *sdkPlugin) setDevices(devs []dev) {
	p.mu.Lock()
	p.devs = sdkDevices(devs)
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *sdkPlugin) stop() {
	if p.cancel == nil {
		return
	}
	p.cancel()
	<-p.done
	p.cancel = nil
}

func (p *sdkPlugin) calls() []string { return p.rec.calls() }

// registrations counts the server's successful (or failed) registrations
// on kubelet.sock, from its metrics.
func (p *sdkPlugin) registrations(result string) float64 {
	mfs, err := p.metrics.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != "dpkit_plugin_registrations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

type sdkBase struct{ p *sdkPlugin }

func (b sdkBase) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	for {
		b.p.mu.Lock()
		devs := slices.Clone(b.p.devs)
		b.p.mu.Unlock()
		notify(devs)
		select {
		case <-ctx.Done():
			return nil
		case <-b.p.wake:
		}
	}
}

func (b sdkBase) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	b.p.rec.add("Allocate%s", sortedList(ids))
	return allocResponse(b.p.def.resource, ids), nil
}

type sdkPreferred struct{ sdkBase }

func (s sdkPreferred) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	var available []string
	for _, d := range req.Available {
		available = append(available, d.ID)
	}
	s.p.rec.add("GetPreferredAllocation(available=%s mustInclude=%s size=%d)", sortedList(available), sortedList(req.MustInclude), req.Size)
	return preferred(available, req.MustInclude, req.Size), nil
}

type sdkPreStart struct{ sdkBase }

func (s sdkPreStart) PreStartContainer(_ context.Context, ids []string) error {
	s.p.rec.add("PreStartContainer%s", sortedList(ids))
	return nil
}

type sdkPreferredPreStart struct{ sdkPreferred }

func (s sdkPreferredPreStart) PreStartContainer(_ context.Context, ids []string) error {
	s.p.rec.add("PreStartContainer%s", sortedList(ids))
	return nil
}

// rawPlugin is a device plugin written against the gRPC API directly; the
// scenario decides when it serves, registers, lists and stops.
type rawPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	registerapi.UnimplementedRegistrationServer

	def    pluginDef
	s      *side
	socket string
	rec    recorder

	mu       sync.Mutex
	devs     []*pluginapi.Device
	changed  chan struct{} // closed and replaced when devs change
	ended    chan struct{} // closed and replaced to end the open streams
	released chan struct{} // closed when ListAndWatch may send
	servers  []*grpc.Server
	statuses chan string // NotifyRegistrationStatus, rendered

	answeredEmpty bool // Allocate calls are serial: the managers admit one pod at a time
}

func newRawPlugin(s *side, def pluginDef) *rawPlugin {
	dir := s.pluginDir
	if def.via == viaRegistry {
		dir = s.registryDir
	}
	p := &rawPlugin{def: def, s: s, socket: filepath.Join(dir, def.socketName()+".sock"),
		changed: make(chan struct{}), ended: make(chan struct{}), released: make(chan struct{}), statuses: make(chan string, 16)}
	p.devs = rawDevices(def.devices)
	if !def.holdList {
		close(p.released)
	}
	return p
}

func rawDevices(devs []dev) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(devs))
	for i, d := range devs {
		out[i] = &pluginapi.Device{ID: d.id, Health: d.health}
		if len(d.numa) > 0 {
			out[i].Topology = &pluginapi.TopologyInfo{}
			for _, n := range d.numa {
				out[i].Topology.Nodes = append(out[i].Topology.Nodes, &pluginapi.NUMANode{ID: n})
			}
		}
	}
	return out
}

// serve (re)creates the socket and serves on it with a new gRPC server;
// a previous server keeps its open connections.
func (p *rawPlugin) serve() error {
	if err := os.Remove(p.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ln, err := net.Listen("unix", p.socket)
	if err != nil {
		return err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	if p.def.via == viaRegistry {
		registerapi.RegisterRegistrationServer(srv, p)
	}
	// An earlier server keeps serving the connections it has, as a
	// plugin process would; stop ends them all.
	p.mu.Lock()
	p.servers = append(p.servers, srv)
	p.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// register calls Register on the side's kubelet.sock and renders the
// answer.
func (p *rawPlugin) register() string {
	conn, err := grpc.NewClient("unix://"+p.s.kubeletSock,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithAuthority("localhost"))
	if err != nil {
		return "error " + err.Error()
	}
	defer conn.Close()
	version := p.def.version
	if version == "" {
		version = pluginapi.Version
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: version, Endpoint: filepath.Base(p.socket), ResourceName: p.def.resource,
		Options: p.options(),
	}, grpc.WaitForReady(true))
	if err != nil {
		st := status.Convert(err)
		return fmt.Sprintf("error %s: %s", st.Code(), st.Message())
	}
	return "ok"
}

func (p *rawPlugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: p.def.preStart, GetPreferredAllocationAvailable: !p.def.noPreferred}
}

func (p *rawPlugin) releaseList() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.released:
	default:
		close(p.released)
	}
}

func (p *rawPlugin) setDevices(devs []dev) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devs = rawDevices(devs)
	close(p.changed)
	p.changed = make(chan struct{})
}

// stop ends every stream and connection and removes the socket.
func (p *rawPlugin) stop() {
	p.mu.Lock()
	servers := p.servers
	p.servers = nil
	p.mu.Unlock()
	for _, srv := range servers {
		srv.Stop()
	}
	_ = os.Remove(p.socket)
}

func (p *rawPlugin) calls() []string { return p.rec.calls() }

func (p *rawPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

func (p *rawPlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	p.mu.Lock()
	ended := p.ended
	p.mu.Unlock()
	select {
	case <-p.released:
	case <-stream.Context().Done():
		return nil
	case <-ended:
		return status.Error(codes.Unavailable, "stream ended by the plugin")
	}
	for {
		p.mu.Lock()
		devs, changed := p.devs, p.changed
		p.mu.Unlock()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-ended:
			return status.Error(codes.Unavailable, "stream ended by the plugin")
		}
	}
}

// endStreams ends the open ListAndWatch streams; the plugin keeps
// serving.
func (p *rawPlugin) endStreams() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.ended)
	p.ended = make(chan struct{})
}

func (p *rawPlugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range req.GetContainerRequests() {
		p.rec.add("GetPreferredAllocation(available=%s mustInclude=%s size=%d)", sortedList(c.AvailableDeviceIDs), sortedList(c.MustIncludeDeviceIDs), c.AllocationSize)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{
			DeviceIDs: preferred(c.AvailableDeviceIDs, c.MustIncludeDeviceIDs, int(c.AllocationSize)),
		})
	}
	return resp, nil
}

func (p *rawPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		p.rec.add("Allocate%s", sortedList(c.DevicesIds))
		resp.ContainerResponses = append(resp.ContainerResponses, allocResponse(p.def.resource, c.DevicesIds))
	}
	switch {
	case p.def.allocateError != "":
		return nil, status.Error(codes.Internal, p.def.allocateError)
	case p.def.emptyAllocate && !p.answeredEmpty:
		p.answeredEmpty = true
		return &pluginapi.AllocateResponse{}, nil
	}
	return resp, nil
}

func (p *rawPlugin) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	p.rec.add("PreStartContainer%s", sortedList(req.DevicesIds))
	return &pluginapi.PreStartContainerResponse{}, nil
}

func (p *rawPlugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	version := p.def.version
	if version == "" {
		version = pluginapi.Version
	}
	return &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: p.def.resource, Endpoint: p.socket, SupportedVersions: []string{version}}, nil
}

func (p *rawPlugin) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s := "registered"
	if !st.PluginRegistered {
		s = "refused: " + st.Error
	}
	select {
	case p.statuses <- s:
	default:
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
