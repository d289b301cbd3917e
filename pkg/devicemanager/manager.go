// Package devicemanager is the kubelet side of the device plugin API
// (v1beta1) as a library: it serves the registration socket, talks to
// plugins, keeps device accounting, allocates devices to containers at pod
// admission with the kubelet's rules, answers the container runtime's
// questions (environment, mounts, device nodes, CDI devices, pre-start
// hooks) and keeps the kubelet-compatible checkpoint.
//
// Everything lives under Config.Root, which stands for the kubelet's root
// directory: the registration socket is Root/device-plugins/kubelet.sock.
//
// See docs/device-manager.md for behaviour and differences from the kubelet.
package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
	"github.com/dpkit/dpkit/pkg/topology"
)

// Manager is the device manager. Create it with New, then Start it.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	policy    topology.Policy
	socketDir string

	// admitMu serialises Admit, like the kubelet's admission loop.
	admitMu sync.Mutex
	// cpMu serialises checkpoint snapshots and writes so they land in order.
	cpMu sync.Mutex

	mu        sync.Mutex
	started   bool
	stopping  bool
	resources map[string]*resourceState
	// owner maps resource -> device ID -> pod UID for every device held by
	// a pod (or reserved for one during Admit).
	owner map[string]map[string]string
	pods  map[string]*podState
	subs  map[int]chan struct{}
	// subFuncs are SubscribeFunc's subscribers.
	subFuncs map[int]func()
	nextSub  int
	// held are the pods whose admission waits for their resources'
	// plugins (Config.AdmissionWait), by UID: "namespace/name".
	held map[string]string

	server *grpc.Server
	ctx    context.Context // cancelled by Stop; parent of plugin streams
	cancel context.CancelFunc
	wake   chan struct{} // re-arms the grace period timer
	// gcRunning says the grace period loop runs (wakeGCLocked).
	gcRunning bool
	// checkpointLost is set when the checkpoint existed but could not be
	// read; unknown then maps resource -> pod UID -> namespace/name of the
	// pods whose devices are unaccounted for (HoldUnknown).
	checkpointLost bool
	unknown        map[string]map[string]string
	// skipCheckpoint disables checkpoint writes; benchmarks only.
	skipCheckpoint bool
	wg             sync.WaitGroup
}

type resourceState struct {
	name    string
	devices map[string]*device
	free    map[topology.Mask]*pool
	groups  topology.DeviceGroups // all devices by NUMA mask
	healthy int
	// gen numbers ListAndWatch messages; devices not seen in the latest
	// one are removed.
	gen uint64
	// endpoints are the connected plugins by socket path; primary is the
	// one whose ListAndWatch updates are applied and which gets calls.
	endpoints map[string]*endpoint
	primary   *endpoint
	// opts are the primary's options, kept after it disconnects: like the
	// kubelet's stopped endpoint, they decide whether PreStartContainer
	// is needed while no plugin is connected. Nil for a resource restored
	// from the checkpoint that has not registered since.
	opts *pluginapi.DevicePluginOptions
	// stopTime is when the last plugin went away; zero while connected.
	stopTime time.Time
	// reported tells that the devices' health is the plugins' word: a
	// ListAndWatch message was applied since the resource last lost all
	// its plugins (see AllocatedResourcesStatus).
	reported bool
	// listed is set once the resource has had device information: a
	// ListAndWatch message arrived, or it was restored from the checkpoint
	// (the kubelet's healthyDevices entry). Until then a connected plugin's
	// resource is not reported, not checkpointed, and not the device
	// manager's to admit, as in the kubelet.
	listed bool
}

type podState struct {
	containers map[string]map[string]*resAlloc // container -> resource -> allocation
	owned      map[string]map[string]struct{}  // resource -> device IDs owned by the pod
}

type resAlloc struct {
	ids  []string
	numa checkpoint.DevicesPerNUMA
	resp *pluginapi.ContainerAllocateResponse
	raw  []byte
	// entry is the assignment's checkpoint entry, encoded at its first
	// checkpoint and kept: an assignment never changes.
	entry *checkpoint.Entry
}

// New validates cfg, applies defaults and returns a stopped Manager.
func New(cfg Config) (*Manager, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid device manager config: %w", err)
	}
	policy, err := topology.NewPolicy(cfg.TopologyPolicy, cfg.NUMANodes)
	if err != nil {
		return nil, err
	}
	return &Manager{
		cfg:       cfg,
		log:       cfg.Logger,
		policy:    policy,
		socketDir: PluginDir(cfg.Root),
		resources: make(map[string]*resourceState),
		owner:     make(map[string]map[string]string),
		pods:      make(map[string]*podState),
		subs:      make(map[int]chan struct{}),
		held:      make(map[string]string),
		wake:      make(chan struct{}, 1),
	}, nil
}

// SocketPath returns the registration socket path.
func (m *Manager) SocketPath() string { return filepath.Join(m.socketDir, "kubelet.sock") }

// CheckpointPath returns the checkpoint file path.
func (m *Manager) CheckpointPath() string { return filepath.Join(m.socketDir, checkpoint.FileName) }

// Start creates the plugin directory, restores the checkpoint, removes
// stale sockets (plugins watch for that to re-register) and serves the
// registration socket. A missing, corrupt or foreign checkpoint is logged
// and ignored. Start may be called once.
func (m *Manager) Start(ctx context.Context) error {
	m.mu.Lock()
	if m.started || m.ctx != nil {
		m.mu.Unlock()
		return errors.New("device manager already started")
	}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.mu.Unlock()

	if err := os.MkdirAll(m.socketDir, 0o750); err != nil {
		return fmt.Errorf("create device plugin directory: %w", err)
	}
	m.restoreCheckpoint()
	if err := m.cleanupSockets(); err != nil {
		m.log.Error("Failed to clean up the device plugin directory", "dir", m.socketDir, "err", err)
	}
	ln, err := unixsock.Listen(m.SocketPath())
	if err != nil {
		m.cancel()
		return fmt.Errorf("listen on the registration socket: %w", err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, &registrationServer{m: m})

	m.mu.Lock()
	m.server = srv
	m.started = true
	m.wg.Add(1)
	// The checkpoint's resources wait for their plugins for the grace
	// period.
	m.wakeGCLocked()
	m.mu.Unlock()

	go func() {
		defer m.wg.Done()
		if err := srv.Serve(ln); err != nil {
			m.log.Error("Registration server stopped", "err", err)
		}
	}()
	m.log.Info("Device manager started", "socket", m.SocketPath())
	return nil
}

// Stop stops the registration server, disconnects every plugin, closes
// subscriptions and waits for every goroutine. The checkpoint stays. Stop
// is safe to call more than once and without Start.
func (m *Manager) Stop() {
	m.mu.Lock()
	if m.stopping || m.ctx == nil {
		m.mu.Unlock()
		return
	}
	m.stopping = true
	srv := m.server
	var eps []*endpoint
	for _, r := range m.resources {
		for _, e := range r.endpoints {
			eps = append(eps, e)
		}
	}
	for id, ch := range m.subs {
		close(ch)
		delete(m.subs, id)
	}
	m.mu.Unlock()

	if srv != nil {
		srv.Stop()
	}
	m.cancel()
	for _, e := range eps {
		e.close()
	}
	m.wg.Wait()
	m.mu.Lock()
	m.started = false
	m.mu.Unlock()
	m.log.Info("Device manager stopped")
}

// cleanupSockets removes every socket in the plugin directory except the
// checkpoint, like the kubelet.
func (m *Manager) cleanupSockets() error {
	entries, err := os.ReadDir(m.socketDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(m.socketDir, e.Name())
		if p == m.CheckpointPath() || e.Type()&os.ModeSocket == 0 {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Subscribe returns a channel that receives a value whenever a resource is
// added or removed or its devices, health or plugin connection change, or
// a pod's admission starts or stops waiting for its plugins (HeldPods).
// Notifications are coalesced: read Resources for the current state. The
// channel is closed by cancel or Stop.
func (m *Manager) Subscribe() (<-chan struct{}, func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := make(chan struct{}, 1)
	if m.stopping {
		close(ch)
		return ch, func() {}
	}
	id := m.nextSub
	m.nextSub++
	m.subs[id] = ch
	return ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if c, ok := m.subs[id]; ok {
			close(c)
			delete(m.subs, id)
		}
	}
}

// SubscribeFunc has f called on every change Subscribe tells of. f is
// called with the manager's lock held: it must only take note and return
// (ondemand.Loop.Ensure, say), without calling the manager. A subscriber
// that way holds no goroutine to wait on a channel. Call cancel to stop.
func (m *Manager) SubscribeFunc(f func()) (cancel func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := m.nextSub
	m.nextSub++
	if m.subFuncs == nil {
		m.subFuncs = map[int]func(){}
	}
	m.subFuncs[id] = f
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		delete(m.subFuncs, id)
	}
}

func (m *Manager) notifyLocked() {
	for _, ch := range m.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	for _, f := range m.subFuncs {
		f()
	}
}

// wakeGCLocked has the grace period loop look again at the resources:
// it starts the loop when a resource waits for its plugin and the loop
// is not running (a node whose plugins are all there has no goroutine for
// it, one fewer for each of the thousand nodes of a process), and wakes
// it when it runs. m.mu is held.
func (m *Manager) wakeGCLocked() {
	if m.gcRunning {
		select {
		case m.wake <- struct{}{}:
		default:
		}
		return
	}
	if !m.started || m.stopping || m.nextExpiryLocked().IsZero() {
		return
	}
	m.gcRunning = true
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.gcLoop()
	}()
}

// gcLoop removes resources whose plugins have been gone longer than the
// grace period; it returns when none waits for its plugin any more, or
// the manager stops.
func (m *Manager) gcLoop() {
	for {
		m.mu.Lock()
		changed := m.collectExpiredLocked()
		next := m.nextExpiryLocked()
		if next.IsZero() {
			m.gcRunning = false
		}
		m.mu.Unlock()
		if changed {
			_ = m.writeCheckpoint() // logged
		}
		if next.IsZero() {
			return
		}
		t := m.cfg.Clock.NewTimer(next.Sub(m.cfg.Clock.Now()))
		select {
		case <-m.ctx.Done():
		case <-m.wake:
		case <-t.C():
		}
		t.Stop()
		if m.ctx.Err() != nil {
			return
		}
	}
}

func (m *Manager) nextExpiryLocked() time.Time {
	var next time.Time
	for _, r := range m.resources {
		if r.stopTime.IsZero() {
			continue
		}
		exp := r.stopTime.Add(m.cfg.GracePeriod)
		if next.IsZero() || exp.Before(next) {
			next = exp
		}
	}
	return next
}

// collectExpiredLocked removes expired resources and reports whether any
// was removed.
func (m *Manager) collectExpiredLocked() bool {
	now := m.cfg.Clock.Now()
	changed := false
	for name, r := range m.resources {
		if r.stopTime.IsZero() || now.Sub(r.stopTime) < m.cfg.GracePeriod {
			continue
		}
		delete(m.resources, name)
		changed = true
		m.log.Info("Resource removed after its plugin stayed away for the grace period", "resource", name, "gracePeriod", m.cfg.GracePeriod)
	}
	if changed {
		m.notifyLocked()
	}
	return changed
}

// sortedKeys returns the keys of a string-keyed map in order.
func sortedKeys[V any](mp map[string]V) []string {
	out := make([]string, 0, len(mp))
	for k := range mp {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func marshalResp(resp *pluginapi.ContainerAllocateResponse) []byte {
	b, err := proto.Marshal(resp)
	if err != nil {
		return nil
	}
	return b
}
