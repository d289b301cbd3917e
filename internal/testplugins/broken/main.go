// Command broken is a device plugin for dpkit verify's tests. It speaks the
// real kubelet device plugin API over unix sockets, written without the
// dpkit SDK so that it can misbehave: -mode picks one deliberate bug, and
// an empty mode is a plugin that does everything right.
//
// It serves example.com/broken with devices dev-0 ... dev-7; dev-7 is
// unhealthy, and dev-6 turns unhealthy -flip-after the first registration.
// When its socket is deleted it listens on a new socket path and registers
// again; the kubelet's connection to the old socket stays open, as the
// kubelet keeps one endpoint per socket path.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/unixsock"
)

// modes returns the modes, each a deliberate bug aimed at one verify
// check, with their descriptions.
func modes() map[string]string {
	return map[string]string{
		"":                         "no bug",
		"register-before-serve":    "calls Register before its socket serves",
		"bad-version":              "first registers with API version v1alpha1",
		"bad-name":                 "first registers with resource name \"broken\" (no domain)",
		"claims-preferred":         "claims GetPreferredAllocationAvailable without implementing it",
		"duplicate-ids":            "lists dev-0 twice in ListAndWatch",
		"partial-updates":          "sends only the devices that changed in ListAndWatch updates",
		"drop-on-update":           "keeps and sends only dev-6 once it turns unhealthy: the other devices vanish",
		"odd-ids":                  "has a device ID that ends in a newline",
		"single-stream":            "serves one ListAndWatch stream at a time",
		"health-first-stream":      "sends health changes only to the first stream ever opened",
		"oversize":                 "lists 50000 devices with long IDs (over 4 MiB)",
		"one-response":             "answers Allocate with one response whatever the number of containers",
		"accept-unknown":           "allocates device IDs it does not have",
		"accept-unhealthy":         "allocates unhealthy devices",
		"no-concurrent-allocate":   "refuses an Allocate while another is in flight",
		"allocate-fails-one":       "fails every Allocate that asks for dev-3",
		"allocate-fails-several":   "fails an Allocate that asks for more than one device for a container",
		"one-device-per-container": "refuses (InvalidArgument) an Allocate that asks for more than one device for a container, a policy",
		"die-on-allocate":          "exits with status 2 on its first Allocate",
		"pref-wrong-size":          "answers GetPreferredAllocation with one ID too few",
		"ignore-must-include":      "ignores mustInclude in GetPreferredAllocation",
		"pref-unavailable":         "answers GetPreferredAllocation with a device that is not available",
		"prestart-fails":           "requires PreStartContainer and fails it",
		"slow-reregister":          "registers again only -delay after a kubelet restart",
		"ignore-socket-delete":     "does not notice that its socket was deleted",
		"reuse-socket":             "re-creates its socket at the same path when it is deleted, leaving the kubelet's old connection open, and registers again once",
		"storm":                    "registers twice every time",
		"bad-getinfo":              "answers the plugin watcher's GetInfo with type CSIPlugin",
		"ignore-sigterm":           "ignores SIGTERM",
		"leave-socket":             "leaves its socket behind on SIGTERM",
	}
}

const resource = "example.com/broken"

func main() {
	mode := flag.String("mode", "", "the bug to have; see -list")
	list := flag.Bool("list", false, "list the modes and exit")
	dir := flag.String("dir", os.Getenv("DPKIT_PLUGIN_DIR"), "device plugin directory (default $DPKIT_PLUGIN_DIR)")
	registryDir := flag.String("registry-dir", "", "register through this plugins_registry directory instead of kubelet.sock")
	delay := flag.Duration("delay", 3*time.Second, "slow-reregister: delay after a kubelet restart")
	flipAfter := flag.Duration("flip-after", time.Second, "when dev-6 turns unhealthy after the first registration")
	flag.Parse()
	if *list {
		for m, d := range modes() {
			fmt.Printf("%-24s %s\n", m, d)
		}
		return
	}
	if _, ok := modes()[*mode]; !ok {
		log.Fatalf("unknown -mode %q; see -list", *mode)
	}
	if *dir == "" {
		log.Fatal("-dir or $DPKIT_PLUGIN_DIR is required")
	}
	sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if *mode == "ignore-sigterm" {
		signal.Ignore(syscall.SIGTERM)
		sigs = sigs[:1]
	}
	ctx, stop := signal.NotifyContext(context.Background(), sigs...)
	defer stop()
	p := newPlugin(*mode, *dir, *flipAfter)
	p.delay = *delay
	if err := p.run(ctx, *registryDir); err != nil {
		log.Fatal(err)
	}
}

type plugin struct {
	mode        string
	dir         string
	kubeletSock string
	delay       time.Duration
	flipAfter   time.Duration
	srv         *grpc.Server

	mu       sync.Mutex
	socket   string // the socket served now
	listens  int
	devs     []*pluginapi.Device
	version  int
	changed  broadcast.Change
	ln       net.Listener
	regSock  os.FileInfo // kubelet.sock at the last registration
	attempts int
	flipOnce sync.Once

	regMu      sync.Mutex // one registration at a time
	streams    atomic.Int32
	streamLock sync.Mutex
	allocating atomic.Int32
}

func newPlugin(mode, dir string, flipAfter time.Duration) *plugin {
	p := &plugin{mode: mode, dir: dir, kubeletSock: filepath.Join(dir, "kubelet.sock"), flipAfter: flipAfter}
	p.socket = filepath.Join(dir, fmt.Sprintf("broken-%d.sock", os.Getpid()))
	n := 8
	if mode == "oversize" {
		n = 50000
	}
	for i := range n {
		id := fmt.Sprintf("dev-%d", i)
		if mode == "oversize" {
			id = fmt.Sprintf("dev-%d-%s", i, strings.Repeat("x", 80))
		}
		h := pluginapi.Healthy
		if i == 7 {
			h = pluginapi.Unhealthy
		}
		if i == 3 && mode == "odd-ids" {
			id += "\n" // as read from a sysfs file, untrimmed
		}
		p.devs = append(p.devs, &pluginapi.Device{ID: id, Health: h})
	}
	if mode == "duplicate-ids" {
		p.devs = append(p.devs, &pluginapi.Device{ID: "dev-0", Health: pluginapi.Healthy})
	}
	return p
}

func (p *plugin) run(ctx context.Context, registryDir string) error {
	p.srv = grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	pluginapi.RegisterDevicePluginServer(p.srv, service{p: p})
	registerapi.RegisterRegistrationServer(p.srv, infoService{p: p})
	if registryDir != "" {
		p.socket = filepath.Join(registryDir, fmt.Sprintf("broken-%d.sock", os.Getpid()))
		if err := p.listen(false); err != nil {
			return err
		}
		p.flip()
		<-ctx.Done()
		return p.shutdown()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	if err := w.Add(p.dir); err != nil {
		return err
	}
	if p.mode == "register-before-serve" {
		_ = p.registerOnce(ctx)
	}
	if err := p.listen(false); err != nil {
		return err
	}
	go p.registerRetry(ctx, false)
	for {
		select {
		case <-ctx.Done():
			return p.shutdown()
		case ev := <-w.Events:
			switch {
			case ev.Name == p.kubeletSock && ev.Has(fsnotify.Create):
				if p.mode == "slow-reregister" {
					select {
					case <-time.After(p.delay):
					case <-ctx.Done():
						return p.shutdown()
					}
				}
				if err := p.ensureListening(); err != nil {
					log.Print(err)
				}
				p.registerRetry(ctx, false)
			case ev.Name == p.sockPath() && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)):
				switch p.mode {
				case "ignore-socket-delete":
					continue
				case "reuse-socket":
					if err := p.listen(false); err != nil {
						log.Print(err)
					}
					if p.sameKubelet() {
						_ = p.registerOnce(ctx)
					}
					continue
				}
				if err := p.listen(true); err != nil {
					log.Print(err)
				}
				if p.sameKubelet() {
					p.registerRetry(ctx, true)
				}
			}
		case err := <-w.Errors:
			log.Print(err)
		}
	}
}

func (p *plugin) shutdown() error {
	p.srv.Stop()
	if p.mode != "leave-socket" {
		if err := os.Remove(p.sockPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

func (p *plugin) sockPath() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.socket
}

// listen serves on the socket, on a new path when fresh. The old listener
// is closed; connections accepted from it stay open.
func (p *plugin) listen(fresh bool) error {
	p.mu.Lock()
	if fresh {
		p.listens++
		p.socket = filepath.Join(filepath.Dir(p.socket), fmt.Sprintf("broken-%d-%d.sock", os.Getpid(), p.listens))
	}
	path := p.socket
	p.mu.Unlock()
	ln, err := unixsock.Listen(path)
	if err != nil {
		return err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	p.mu.Lock()
	if p.ln != nil {
		_ = p.ln.Close()
	}
	p.ln = ln
	p.mu.Unlock()
	go func() { _ = p.srv.Serve(ln) }()
	return nil
}

func (p *plugin) ensureListening() error {
	if _, err := os.Stat(p.sockPath()); err == nil {
		return nil
	}
	return p.listen(false)
}

// sameKubelet reports whether kubelet.sock is the one registered with.
func (p *plugin) sameKubelet() bool {
	fi, err := os.Stat(p.kubeletSock)
	p.mu.Lock()
	defer p.mu.Unlock()
	return err == nil && p.regSock != nil && os.SameFile(fi, p.regSock) && fi.ModTime().Equal(p.regSock.ModTime())
}

// registerRetry registers until it succeeds. Unless force, a kubelet.sock
// that already has this plugin is left alone.
func (p *plugin) registerRetry(ctx context.Context, force bool) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	for ctx.Err() == nil {
		if !force && p.sameKubelet() {
			return
		}
		if err := p.registerOnce(ctx); err == nil {
			if p.mode == "storm" {
				_ = p.registerOnce(ctx)
			}
			p.flip()
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *plugin) registerOnce(ctx context.Context) error {
	fi, err := os.Stat(p.kubeletSock)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.attempts++
	first := p.attempts == 1
	p.mu.Unlock()
	req := &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(p.sockPath()), ResourceName: resource,
		Options: p.options(),
	}
	switch {
	case first && p.mode == "bad-version":
		req.Version = "v1alpha1"
	case first && p.mode == "bad-name":
		req.ResourceName = "broken"
	}
	cc, err := grpc.NewClient("unix://"+p.kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(cc).Register(rctx, req); err != nil {
		log.Printf("register: %v", err)
		return err
	}
	p.mu.Lock()
	p.regSock = fi
	p.mu.Unlock()
	return nil
}

func (p *plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{
		GetPreferredAllocationAvailable: p.mode != "oversize",
		PreStartRequired:                p.mode == "prestart-fails" || p.mode == "",
	}
}

// flip turns dev-6 unhealthy flipAfter from now, once.
func (p *plugin) flip() {
	p.flipOnce.Do(func() {
		time.AfterFunc(p.flipAfter, func() {
			p.mu.Lock()
			if len(p.devs) > 6 {
				p.devs = slices.Clone(p.devs)
				p.devs[6] = &pluginapi.Device{ID: p.devs[6].ID, Health: pluginapi.Unhealthy}
			}
			if p.mode == "drop-on-update" {
				p.devs = p.devs[6:7]
			}
			p.version++
			p.mu.Unlock()
			p.changed.Broadcast()
		})
	})
}

func (p *plugin) snapshot() ([]*pluginapi.Device, int, <-chan struct{}) {
	ch := p.changed.C()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devs, p.version, ch
}

func (p *plugin) device(id string) *pluginapi.Device {
	devs, _, _ := p.snapshot()
	for _, d := range devs {
		if d.ID == id {
			return d
		}
	}
	return nil
}

type service struct {
	pluginapi.UnimplementedDevicePluginServer
	p *plugin
}

func (s service) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return s.p.options(), nil
}

func (s service) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	p := s.p
	n := p.streams.Add(1)
	if p.mode == "single-stream" {
		p.streamLock.Lock()
		defer p.streamLock.Unlock()
	}
	sent := -1
	var last []*pluginapi.Device
	for {
		devs, v, ch := p.snapshot()
		if v != sent && (sent < 0 || p.mode != "health-first-stream" || n == 1) {
			out := devs
			if p.mode == "partial-updates" && sent >= 0 {
				out = changed(last, devs)
			}
			if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: out}); err != nil {
				return err
			}
			last = devs
		}
		sent = v
		select {
		case <-ch:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// changed returns the devices of now that are new or have another health
// than in prev.
func changed(prev, now []*pluginapi.Device) []*pluginapi.Device {
	health := map[string]string{}
	for _, d := range prev {
		health[d.ID] = d.Health
	}
	var out []*pluginapi.Device
	for _, d := range now {
		if h, ok := health[d.ID]; !ok || h != d.Health {
			out = append(out, d)
		}
	}
	return out
}

func (s service) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p := s.p
	if p.mode == "die-on-allocate" {
		log.Print("Allocate: giving up")
		os.Exit(2)
	}
	if p.mode == "no-concurrent-allocate" {
		if p.allocating.Add(1) > 1 {
			p.allocating.Add(-1)
			return nil, status.Error(codes.Unavailable, "busy: another Allocate is in progress")
		}
		defer p.allocating.Add(-1)
		time.Sleep(100 * time.Millisecond)
	}
	resp := &pluginapi.AllocateResponse{}
	for _, creq := range req.ContainerRequests {
		if len(creq.DevicesIds) > 1 && p.mode == "allocate-fails-several" {
			// A bug: the plugin meant to serve several devices.
			return nil, status.Errorf(codes.Internal, "index out of range [1] with length 1 (%d devices)", len(creq.DevicesIds))
		}
		if len(creq.DevicesIds) > 1 && p.mode == "one-device-per-container" {
			// A policy, said the way the NVIDIA plugin's
			// failRequestsGreaterThanOne says it.
			return nil, status.Errorf(codes.InvalidArgument, "one device per container, got %d", len(creq.DevicesIds))
		}
		for _, id := range creq.DevicesIds {
			d := p.device(id)
			if d == nil && p.mode != "accept-unknown" {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q", id)
			}
			if d != nil && d.Health != pluginapi.Healthy && p.mode != "accept-unhealthy" {
				return nil, status.Errorf(codes.FailedPrecondition, "device %q is unhealthy", id)
			}
			if id == "dev-3" && p.mode == "allocate-fails-one" {
				return nil, status.Errorf(codes.Internal, "open /dev/%s: no such device", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"BROKEN_DEVICES": strings.Join(creq.DevicesIds, ",")},
		})
		if p.mode == "one-response" {
			break
		}
	}
	return resp, nil
}

func (s service) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	p := s.p
	if p.mode == "claims-preferred" {
		return nil, status.Error(codes.Unimplemented, "method GetPreferredAllocation not implemented")
	}
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, creq := range req.ContainerRequests {
		size := int(creq.AllocationSize)
		var ids []string
		add := func(id string) {
			if len(ids) < size && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		if p.mode != "ignore-must-include" {
			for _, id := range creq.MustIncludeDeviceIDs {
				add(id)
			}
		}
		if p.mode == "pref-unavailable" {
			add("dev-7")
		}
		for _, id := range creq.AvailableDeviceIDs {
			add(id)
		}
		if p.mode == "pref-wrong-size" && len(ids) > 1 {
			ids = ids[:len(ids)-1]
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

func (s service) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if s.p.mode == "prestart-fails" {
		return nil, status.Error(codes.Internal, "device reset failed")
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// infoService answers the plugin watcher.
type infoService struct {
	registerapi.UnimplementedRegistrationServer
	p *plugin
}

func (s infoService) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	typ := registerapi.DevicePlugin
	if s.p.mode == "bad-getinfo" {
		typ = registerapi.CSIPlugin
	}
	return &registerapi.PluginInfo{Type: typ, Name: resource, Endpoint: s.p.sockPath(), SupportedVersions: []string{pluginapi.Version}}, nil
}

func (s infoService) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.PluginRegistered {
		s.p.flip()
	} else {
		log.Printf("plugin watcher refused: %s", st.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
