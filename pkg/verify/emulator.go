package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/kubeletreg"
	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/resourcename"
)

// errFailedToDialDevicePlugin starts the kubelet's registration error for
// a plugin it cannot reach (pkg/kubelet/cm/devicemanager/plugin/v1beta1).
// The other answers come from package kubeletreg, shared with dpkit's
// device manager and dptest, so a plugin sees what a real kubelet would
// answer.
const errFailedToDialDevicePlugin = "failed to dial device plugin:"

// takeoverGrace is how long the emulator waits for the old connection to a
// socket path to close before it refuses a registration for that path as
// already connected. The kubelet refuses at once, so a plugin that closes
// its old connection and registers in the same instant races it; the grace
// keeps verify's verdict from depending on that race.
const takeoverGrace = 500 * time.Millisecond

// Registration paths.
const (
	viaKubeletSocket = "kubelet.sock"
	viaRegistry      = "plugins_registry"
)

// clientMaxRecv is how large a message the emulator accepts from a plugin.
// The kubelet accepts 4 MiB; the emulator reads more so that it can measure
// and report an oversize message instead of only seeing the stream fail.
const clientMaxRecv = 256 << 20

// registration is one registration attempt as the emulator saw it.
type registration struct {
	At       time.Time
	Via      string
	Resource string
	Version  string
	Endpoint string // socket path
	// Options is what the RegisterRequest claimed (nil in registry mode).
	Options *pluginapi.DevicePluginOptions
	// NotServing is why the socket did not answer GetDevicePluginOptions
	// at the moment the registration arrived; nil when it did.
	NotServing error
	// Err is the kubelet's refusal; nil when accepted.
	Err error
	// AlreadyConnected is set when Err is the kubelet's "device plugin
	// already connected": the emulated kubelet still had an open
	// connection for this resource and socket path.
	AlreadyConnected bool
	// Recreated is set with AlreadyConnected when the socket file at the
	// path is not the one that connection was made to: the plugin created
	// it again while its old connection stayed open. Without it the
	// registration merely repeats one the kubelet already has.
	Recreated bool
	// Epoch is the number of emulated kubelet restarts before it arrived.
	Epoch int

	// sock is the socket file at Endpoint when the registration arrived
	// (nil when there was none).
	sock os.FileInfo
}

// counted reports whether r counts as a registration of its resource for
// restart.single-registration: accepted, or refused only because it
// repeated a registration the kubelet was still connected to.
func (r registration) counted() bool {
	return r.Err == nil || (r.AlreadyConnected && !r.Recreated)
}

// message is one ListAndWatch message.
type message struct {
	At      time.Time
	Size    int
	Devices []*pluginapi.Device
}

// conn is the emulated kubelet's connection to one accepted registration:
// its client and the ListAndWatch stream the kubelet keeps open.
type conn struct {
	Resource string
	Socket   string
	Client   pluginapi.DevicePluginClient
	Options  *pluginapi.DevicePluginOptions
	// SDK is the value of the dpkit SDK's header (deviceplugin.SDKHeader)
	// in the answer to GetDevicePluginOptions: "" when the plugin is not
	// built on the SDK.
	SDK string

	// sock is the socket file the connection was made to (nil when it
	// could not be read), to tell a re-created socket from the same one.
	sock os.FileInfo

	cc     *grpc.ClientConn
	cancel context.CancelFunc

	// guarded by the emulator's mu
	msgs   []message
	ended  bool
	endErr error
}

// emulator is a kubelet registration endpoint built for observation: it
// records every registration with its time, whether the plugin was already
// serving, and every ListAndWatch message, and can restart (re-create
// kubelet.sock, dropping every connection and socket) like the kubelet.
type emulator struct {
	dir         string
	sock        string
	dialTimeout time.Duration
	log         *slog.Logger

	mu       sync.Mutex
	srv      *grpc.Server
	epoch    int
	regs     []*registration
	latest   map[string]*conn // resource -> latest accepted registration
	conns    []*conn
	history  []*conn // every accepted connection of the run
	changed  broadcast.Change
	inflight int // registrations being handled, not yet recorded
	stopped  bool
	restarts []time.Time // when kubelet.sock was created again
}

func newEmulator(dir string, dialTimeout time.Duration, log *slog.Logger) *emulator {
	return &emulator{
		dir:         dir,
		sock:        filepath.Join(dir, filepath.Base(pluginapi.KubeletSocket)),
		dialTimeout: dialTimeout,
		log:         log,
		latest:      make(map[string]*conn),
	}
}

// start serves kubelet.sock (a stale socket is replaced).
func (e *emulator) start() (time.Time, error) {
	ln, err := unixsock.Listen(e.sock)
	if err != nil {
		return time.Time{}, fmt.Errorf("listen on %s: %w", e.sock, err)
	}
	created := time.Now()
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, regServer{e: e})
	e.mu.Lock()
	e.srv = srv
	e.stopped = false
	e.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	return created, nil
}

// stop stops the registration server and drops every plugin connection,
// as a kubelet that exits does.
func (e *emulator) stop() {
	e.mu.Lock()
	srv := e.srv
	conns := e.conns
	e.conns = nil
	e.latest = make(map[string]*conn)
	e.stopped = true
	e.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
	for _, c := range conns {
		c.close()
	}
	e.broadcast()
}

// restart emulates a kubelet restart: the registration server stops, every
// connection drops, every socket in the directory is removed (the kubelet
// cleans its device plugin directory when it starts) and kubelet.sock is
// created again. It returns when kubelet.sock exists again.
func (e *emulator) restart() (time.Time, error) {
	e.stop()
	entries, err := os.ReadDir(e.dir)
	if err != nil {
		return time.Time{}, fmt.Errorf("restart: %w", err)
	}
	for _, ent := range entries {
		if ent.Type()&os.ModeSocket != 0 {
			_ = os.Remove(filepath.Join(e.dir, ent.Name()))
		}
	}
	e.mu.Lock()
	e.epoch++
	e.mu.Unlock()
	at, err := e.start()
	if err != nil {
		return time.Time{}, fmt.Errorf("restart: %w", err)
	}
	e.mu.Lock()
	e.restarts = append(e.restarts, at)
	e.mu.Unlock()
	e.broadcast()
	return at, nil
}

func (e *emulator) broadcast() { e.changed.Broadcast() }

// waitFor calls cond under the lock after every change until it is true,
// ctx ends or timeout passes; it reports whether cond became true.
func (e *emulator) waitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		ch := e.changed.C()
		e.mu.Lock()
		ok := cond()
		e.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// registrations returns a copy of every registration so far.
func (e *emulator) registrations() []registration {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]registration, len(e.regs))
	for i, r := range e.regs {
		out[i] = *r
	}
	return out
}

// current returns the latest accepted connection of resource, or nil.
func (e *emulator) current(resource string) *conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.latest[resource]
}

// messages returns the messages c received so far and whether its stream
// ended (with the error).
func (e *emulator) messages(c *conn) ([]message, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]message(nil), c.msgs...), c.ended, c.endErr
}

// record adds a registration and wakes waiters.
func (e *emulator) record(r *registration) { e.recordDone(r, false) }

// arrive notes a registration that is being handled; the function it
// returns records it. Until then settled reports false, so that nobody
// takes the registrations as complete while the emulated kubelet is still
// dialing a plugin or waiting for an old connection to close.
func (e *emulator) arrive() func(*registration) {
	e.mu.Lock()
	e.inflight++
	e.mu.Unlock()
	e.broadcast()
	return func(r *registration) { e.recordDone(r, true) }
}

func (e *emulator) recordDone(r *registration, arrived bool) {
	e.mu.Lock()
	r.Epoch = e.epoch
	e.regs = append(e.regs, r)
	if arrived {
		e.inflight--
	}
	e.mu.Unlock()
	e.broadcast()
}

// settled reports whether no registration is being handled. The
// emulator's lock must be held.
func (e *emulator) settled() bool { return e.inflight == 0 }

// dialPlugin opens a client to a plugin socket the way the kubelet does
// (authority localhost, no TLS), reading up to clientMaxRecv bytes.
func dialPlugin(socket string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(clientMaxRecv)))
}

// connect does what the kubelet does for an accepted registration: it
// dials the plugin (waiting up to the dial timeout, as the kubelet's
// blocking dial does), asks GetDevicePluginOptions and keeps a
// ListAndWatch stream open. notServing reports whether the socket answered
// at once.
func (e *emulator) connect(ctx context.Context, r *registration) (c *conn, notServing error, err error) {
	if old := e.connectedTo(r.Resource, r.Endpoint); old != nil {
		closed := e.waitFor(ctx, takeoverGrace, func() bool { return old.ended })
		if !closed {
			r.AlreadyConnected, r.Recreated = true, !sameSocket(old.sock, r.sock)
			return nil, nil, kubeletreg.AlreadyConnected(r.Endpoint)
		}
	}
	cc, err := dialPlugin(r.Endpoint)
	if err != nil {
		return nil, err, fmt.Errorf("%s %w", errFailedToDialDevicePlugin, err)
	}
	client := pluginapi.NewDevicePluginClient(cc)
	// At once: is the plugin serving right now?
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	var header metadata.MD
	opts, perr := client.GetDevicePluginOptions(pctx, &pluginapi.Empty{}, grpc.Header(&header))
	cancel()
	if perr != nil {
		notServing = perr
		// The kubelet's dial blocks for up to 10s: give the plugin as long.
		wctx, cancel := context.WithTimeout(ctx, e.dialTimeout)
		opts, err = client.GetDevicePluginOptions(wctx, &pluginapi.Empty{}, grpc.WaitForReady(true), grpc.Header(&header))
		cancel()
		if err != nil {
			_ = cc.Close()
			return nil, notServing, fmt.Errorf("%s %w", errFailedToDialDevicePlugin, err)
		}
	}
	sctx, scancel := context.WithCancel(context.Background())
	c = &conn{Resource: r.Resource, Socket: r.Endpoint, Client: client, Options: opts, sock: r.sock, cc: cc, cancel: scancel}
	if v := header.Get(deviceplugin.SDKHeader); len(v) > 0 {
		c.SDK = v[0]
	}
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		c.close()
		return nil, notServing, errors.New("kubelet is stopping")
	}
	e.conns = append(e.conns, c)
	e.history = append(e.history, c)
	e.latest[r.Resource] = c
	e.mu.Unlock()
	go e.watch(sctx, c)
	return c, notServing, nil
}

// connectedTo returns the latest connection to resource at socket whose
// ListAndWatch stream is still open, or nil.
func (e *emulator) connectedTo(resource, socket string) *conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.conns) - 1; i >= 0; i-- {
		if c := e.conns[i]; c.Resource == resource && c.Socket == socket && !c.ended {
			return c
		}
	}
	return nil
}

// sameSocket reports whether a and b describe the same socket file.
// Inode numbers are reused at once when a socket is created again, so the
// modification time must match too.
func sameSocket(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}

func (c *conn) close() {
	c.cancel()
	_ = c.cc.Close()
}

// watch consumes c's ListAndWatch stream like the kubelet, recording every
// message and its encoded size.
func (e *emulator) watch(ctx context.Context, c *conn) {
	stream, err := c.Client.ListAndWatch(ctx, &pluginapi.Empty{})
	for err == nil {
		var resp *pluginapi.ListAndWatchResponse
		resp, err = stream.Recv()
		if err != nil {
			break
		}
		e.mu.Lock()
		c.msgs = append(c.msgs, message{At: time.Now(), Size: proto.Size(resp), Devices: resp.Devices})
		e.mu.Unlock()
		e.broadcast()
	}
	e.mu.Lock()
	c.ended, c.endErr = true, err
	e.mu.Unlock()
	e.broadcast()
}

// regServer is the emulated kubelet.sock Registration service.
type regServer struct {
	pluginapi.UnimplementedRegistrationServer
	e *emulator
}

func (s regServer) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	e := s.e
	r := &registration{
		At: time.Now(), Via: viaKubeletSocket, Resource: req.ResourceName, Version: req.Version,
		Endpoint: filepath.Join(e.dir, req.Endpoint), Options: req.Options,
	}
	r.sock, _ = os.Stat(r.Endpoint)
	record := e.arrive()
	e.log.Debug("Register", "resource", req.ResourceName, "endpoint", req.Endpoint, "version", req.Version)
	err := validateRegistration(req.Version, req.ResourceName)
	if err == nil {
		_, r.NotServing, err = e.connect(ctx, r)
	} else {
		// Still note whether the plugin was serving.
		if cc, derr := dialPlugin(r.Endpoint); derr == nil {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			_, r.NotServing = pluginapi.NewDevicePluginClient(cc).GetDevicePluginOptions(pctx, &pluginapi.Empty{})
			cancel()
			_ = cc.Close()
		}
	}
	r.Err = err
	record(r)
	if err != nil {
		return &pluginapi.Empty{}, err
	}
	return &pluginapi.Empty{}, nil
}

// validateRegistration applies the kubelet's checks of a RegisterRequest,
// with its error texts.
func validateRegistration(version, resource string) error {
	return kubeletreg.CheckRequest(version, resource)
}

// registryHandler is the emulated kubelet's device plugin handler for the
// plugin watcher (plugins_registry).
type registryHandler struct{ e *emulator }

// validateOnly applies the kubelet's ValidatePlugin rules for device
// plugins, with its error texts.
func (registryHandler) validateOnly(name string, versions []string) error {
	supported := false
	for _, v := range versions {
		for _, s := range pluginapi.SupportedVersions {
			if v == s {
				supported = true
			}
		}
	}
	switch {
	case !supported:
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v", pluginapi.Version, versions)
	case !resourcename.Valid(name):
		return fmt.Errorf("invalid name of device plugin socket: %w", kubeletreg.InvalidResourceName(name))
	}
	return nil
}

func (h registryHandler) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	err := h.validateOnly(name, versions)
	if err != nil {
		v := ""
		if len(versions) > 0 {
			v = versions[0]
		}
		h.e.record(&registration{At: time.Now(), Via: viaRegistry, Resource: name, Version: v, Endpoint: endpoint, Err: err})
	}
	return err
}

func (h registryHandler) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string) error {
	r := &registration{At: time.Now(), Via: viaRegistry, Resource: name, Version: pluginapi.Version, Endpoint: endpoint}
	r.sock, _ = os.Stat(endpoint)
	record := h.e.arrive()
	var err error
	_, r.NotServing, err = h.e.connect(ctx, r)
	r.Err = err
	record(r)
	return err
}

func (h registryHandler) DeRegisterPlugin(context.Context, string, string) {}

// removeFile removes path, which must exist.
func removeFile(path string) error { return os.Remove(path) }
