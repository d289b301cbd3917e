package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/backoff"
	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/inventory"
)

// Driver is a DRA driver serving one inventory.
type Driver struct {
	cfg     Config
	inv     *inventory.Inventory
	log     *slog.Logger
	metrics *metrics

	regSock, endpoint, checkpointPath string

	// mu serialises prepare and unprepare and guards prepared.
	mu       sync.Mutex
	prepared map[string]*preparedClaim // claim UID -> what was prepared

	statusMu      sync.Mutex
	status        *registerapi.RegistrationStatus
	statusChanged broadcast.Change
}

// New validates cfg, applies its defaults and returns a driver for inv.
// It reads the checkpoint of an earlier run (a corrupt one is an error
// naming the file), acquires the devices of the claims it lists in the
// inventory and writes their CDI specs again where they are gone.
func New(cfg Config, inv *inventory.Inventory) (*Driver, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if inv == nil {
		return nil, errors.New("dra.New: the inventory is nil; pass inventory.New(resource, plugin, log)")
	}
	d := &Driver{
		cfg:            cfg,
		inv:            inv,
		log:            cfg.Logger.With("driver", cfg.DriverName),
		regSock:        filepath.Join(cfg.RegistryDir, cfg.DriverName+"-reg.sock"),
		endpoint:       filepath.Join(cfg.PluginsDir, cfg.DriverName, "dra.sock"),
		checkpointPath: filepath.Join(cfg.PluginsDir, cfg.DriverName, CheckpointFile),
	}
	m, err := newMetrics(cfg.Registerer, cfg.DriverName)
	if err != nil {
		return nil, err
	}
	d.metrics = m
	prepared, err := readCheckpoint(d.checkpointPath)
	if err != nil {
		return nil, err
	}
	d.prepared = prepared
	// Hold the checkpointed claims' devices before anything else can give
	// them out (the device plugin front may run already).
	d.restore()
	return d, nil
}

// Endpoint returns the path of the driver's DRAPlugin socket.
func (d *Driver) Endpoint() string { return d.endpoint }

// RegistrationSocket returns the path of the driver's registration socket.
func (d *Driver) RegistrationSocket() string { return d.regSock }

// RegistrationStatus returns what the kubelet last said about the
// registration, nil before it said anything.
func (d *Driver) RegistrationStatus() *registerapi.RegistrationStatus {
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	return d.status
}

// Ready returns nil once the kubelet has registered the driver, and
// otherwise why it is not ready: what a readiness probe reports (a pod
// prepared before its driver registers waits for the kubelet's next
// sync of the pod, up to a minute).
func (d *Driver) Ready() error {
	st := d.RegistrationStatus()
	switch {
	case st == nil:
		return fmt.Errorf("DRA driver %s: not registered with the kubelet yet (registration socket %s)", d.cfg.DriverName, d.regSock)
	case !st.PluginRegistered:
		return fmt.Errorf("DRA driver %s: the kubelet refused the registration: %s", d.cfg.DriverName, st.Error)
	}
	return nil
}

// RegistrationChanged returns a channel closed when the kubelet next says
// something about the registration. Take it before reading
// RegistrationStatus.
func (d *Driver) RegistrationChanged() <-chan struct{} { return d.statusChanged.C() }

// Run serves the driver's sockets and publishes its
// devices until ctx ends; then it stops serving and removes its sockets.
// Run the inventory (inventory.Run) beside it.
func (d *Driver) Run(ctx context.Context) error {
	srv := grpc.NewServer()
	drav1.RegisterDRAPluginServer(srv, nodeService{d: d})
	drahealthv1.RegisterDRAResourceHealthServer(srv, healthService{d: d})
	registerapi.RegisterRegistrationServer(srv, registrationService{d: d})

	socks := []*socket{{path: d.endpoint}, {path: d.regSock}}
	for _, s := range socks {
		if err := s.listen(srv); err != nil {
			srv.Stop()
			return err
		}
	}
	fsw, err := fsnotify.NewWatcher()
	if err != nil {
		srv.Stop()
		return fmt.Errorf("watch the driver's sockets: %w", err)
	}
	for _, s := range socks {
		if err := fsw.Add(filepath.Dir(s.path)); err != nil {
			_ = fsw.Close()
			srv.Stop()
			return fmt.Errorf("watch %s: %w", filepath.Dir(s.path), err)
		}
	}
	d.log.Info("DRA driver serving", "endpoint", d.endpoint, "registration", d.regSock)

	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	if d.cfg.Slices != nil {
		wg.Go(func() { d.publishLoop(ctx) })
	}
	wg.Go(func() { d.watchSockets(ctx, fsw, srv, socks) })
	<-ctx.Done()
	cancel()
	wg.Wait()
	_ = fsw.Close()
	srv.Stop()
	for _, s := range socks {
		s.remove()
	}
	return nil
}

// socket is one of the driver's unix sockets, listened on again when the
// file is removed.
type socket struct {
	path string
	info os.FileInfo
	ln   net.Listener
}

func (s *socket) listen(srv *grpc.Server) error {
	ln, err := unixsock.Listen(s.path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Stat(s.path)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("stat %s: %w", s.path, err)
	}
	if s.ln != nil {
		_ = s.ln.Close() // its file is gone; nobody can reach it
	}
	s.info, s.ln = fi, ln
	go func() { _ = srv.Serve(ln) }()
	return nil
}

// owned reports whether the file at the path is still the socket this
// driver created.
func (s *socket) owned() bool {
	fi, err := os.Stat(s.path)
	return err == nil && s.info != nil && os.SameFile(fi, s.info)
}

func (s *socket) remove() {
	if s.owned() {
		_ = os.Remove(s.path)
	}
}

// watchSockets serves a socket again when its file is removed (the kubelet
// cleans its plugin directories; an admin deletes a file), as the device
// plugin SDK does; a failed listen is retried with back-off.
func (d *Driver) watchSockets(ctx context.Context, fsw *fsnotify.Watcher, srv *grpc.Server, socks []*socket) {
	b := backoff.Retry{Exponential: backoff.Exponential{Initial: 100 * time.Millisecond, Max: 5 * time.Second}}
	var retry <-chan time.Time
	check := func() {
		failed := false
		for _, s := range socks {
			if s.owned() {
				continue
			}
			if err := s.listen(srv); err != nil {
				d.log.Error("Could not serve a removed socket again; retrying", "socket", s.path, "err", err)
				failed = true
				continue
			}
			d.log.Info("Socket was removed; serving it again", "socket", s.path)
			d.metrics.relistens.Inc()
		}
		if failed {
			retry = d.cfg.Clock.After(b.Next())
		} else {
			b.Reset()
			retry = nil
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-fsw.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				check()
			}
		case err, ok := <-fsw.Errors:
			if !ok {
				return
			}
			d.log.Warn("Watching the driver's sockets", "err", err)
			check()
		case <-retry:
			check()
		}
	}
}

// registrationService answers the kubelet's plugin watcher.
type registrationService struct {
	registerapi.UnimplementedRegistrationServer
	d *Driver
}

func (r registrationService) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DRAPlugin,
		Name:              r.d.cfg.DriverName,
		Endpoint:          r.d.endpoint,
		SupportedVersions: []string{drav1.DRAPluginService, drahealthv1.DRAResourceHealthService},
	}, nil
}

func (r registrationService) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.d.statusMu.Lock()
	r.d.status = st
	r.d.statusMu.Unlock()
	r.d.statusChanged.Broadcast()
	if st.PluginRegistered {
		r.d.log.Info("Registered with the kubelet")
	} else {
		r.d.log.Error("The kubelet refused the registration", "err", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
