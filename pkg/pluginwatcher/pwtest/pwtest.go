// Package pwtest provides fakes for testing code that uses or is used by
// the plugin watcher: a plugin registration server (Plugin) and a Handler
// that records its calls (Handler).
package pwtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/unixsock"
)

// Plugin is a fake plugin: a pluginregistration v1 server on a unix
// socket that answers GetInfo with a fixed PluginInfo and records every
// RegistrationStatus it is sent.
type Plugin struct {
	socket string
	file   os.FileInfo
	info   *registerapi.PluginInfo
	srv    *grpc.Server
	served chan struct{}

	mu       sync.Mutex
	failing  bool
	getInfos int
	statuses []*registerapi.RegistrationStatus
	n        broadcast.Change
}

// StartPlugin serves a fake plugin at socket. Close stops it and removes
// the socket.
func StartPlugin(socket string, info *registerapi.PluginInfo) (*Plugin, error) {
	l, err := unixsock.Listen(socket)
	if err != nil {
		return nil, fmt.Errorf("pwtest: listening on %s: %w", socket, err)
	}
	// Close decides itself whether to remove the socket.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	file, err := os.Lstat(socket)
	if err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("pwtest: %w", err)
	}
	p := &Plugin{socket: socket, file: file, info: info, srv: grpc.NewServer(), served: make(chan struct{})}
	registerapi.RegisterRegistrationServer(p.srv, &registrationServer{p: p})
	go func() {
		defer close(p.served)
		_ = p.srv.Serve(l)
	}()
	return p, nil
}

// Close stops the server and removes the socket if it is still the file
// the plugin created (not one that replaced it); it is idempotent.
func (p *Plugin) Close() {
	p.srv.Stop()
	<-p.served
	socket := p.Socket()
	if fi, err := os.Lstat(socket); err == nil && os.SameFile(fi, p.file) {
		_ = os.Remove(socket)
	}
}

// Socket returns the path the plugin listens on.
func (p *Plugin) Socket() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.socket
}

// MoveTo renames the plugin's socket to path, replacing any file there,
// as a plugin that creates its socket under a temporary name does.
func (p *Plugin) MoveTo(path string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := os.Rename(p.socket, path); err != nil {
		return fmt.Errorf("pwtest: %w", err)
	}
	p.socket = path
	return nil
}

// SetFailing makes GetInfo fail with Unavailable (failing true), as a
// plugin that stopped working while its socket stays, or answer again.
func (p *Plugin) SetFailing(failing bool) {
	p.mu.Lock()
	p.failing = failing
	p.mu.Unlock()
}

// GetInfoCalls returns how many times GetInfo was called.
func (p *Plugin) GetInfoCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.getInfos
}

// Statuses returns the registration statuses received so far.
func (p *Plugin) Statuses() []*registerapi.RegistrationStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.statuses)
}

// WaitStatuses waits until at least n statuses were received and returns
// them all, or returns an error when ctx is done first.
func (p *Plugin) WaitStatuses(ctx context.Context, n int) ([]*registerapi.RegistrationStatus, error) {
	for {
		ch := p.n.C()
		if s := p.Statuses(); len(s) >= n {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return p.Statuses(), fmt.Errorf("pwtest: waiting for %d registration statuses at %s (got %d): %w", n, p.Socket(), len(p.Statuses()), ctx.Err())
		}
	}
}

type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	p *Plugin
}

func (s *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	s.p.mu.Lock()
	s.p.getInfos++
	failing := s.p.failing
	s.p.mu.Unlock()
	s.p.n.Broadcast()
	if failing {
		return nil, status.Error(codes.Unavailable, "pwtest: plugin set to fail")
	}
	return s.p.info, nil
}

func (s *registrationServer) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	s.p.mu.Lock()
	s.p.statuses = append(s.p.statuses, st)
	s.p.mu.Unlock()
	s.p.n.Broadcast()
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Call is one call a Handler received.
type Call struct {
	// Op is "validate", "register" or "deregister".
	Op       string
	Name     string
	Endpoint string
	Versions []string
	// Time is when the call arrived (wall clock).
	Time time.Time
}

// Handler records the calls of the plugin watcher. ValidateErr and
// RegisterErr, when set, decide the outcome of ValidatePlugin and
// RegisterPlugin; they must be set before the handler is used.
type Handler struct {
	ValidateErr func(name, endpoint string, versions []string) error
	RegisterErr func(name, endpoint string, versions []string) error

	mu    sync.Mutex
	calls []Call
	n     broadcast.Change
}

func (h *Handler) record(op, name, endpoint string, versions []string) {
	h.mu.Lock()
	h.calls = append(h.calls, Call{Op: op, Name: name, Endpoint: endpoint, Versions: slices.Clone(versions), Time: time.Now()})
	h.mu.Unlock()
	h.n.Broadcast()
}

// ValidatePlugin implements pluginwatcher.Handler.
func (h *Handler) ValidatePlugin(_ context.Context, name, endpoint string, versions []string) error {
	h.record("validate", name, endpoint, versions)
	if h.ValidateErr != nil {
		return h.ValidateErr(name, endpoint, versions)
	}
	return nil
}

// RegisterPlugin implements pluginwatcher.Handler.
func (h *Handler) RegisterPlugin(_ context.Context, name, endpoint string, versions []string) error {
	h.record("register", name, endpoint, versions)
	if h.RegisterErr != nil {
		return h.RegisterErr(name, endpoint, versions)
	}
	return nil
}

// DeRegisterPlugin implements pluginwatcher.Handler.
func (h *Handler) DeRegisterPlugin(_ context.Context, name, endpoint string) {
	h.record("deregister", name, endpoint, nil)
}

// Calls returns the calls received so far.
func (h *Handler) Calls() []Call {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.calls)
}

// Ops returns the Op of every call received so far, in order.
func (h *Handler) Ops() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	ops := make([]string, len(h.calls))
	for i, c := range h.calls {
		ops[i] = c.Op
	}
	return ops
}

// WaitCalls waits until at least n calls were received and returns them
// all, or returns an error when ctx is done first.
func (h *Handler) WaitCalls(ctx context.Context, n int) ([]Call, error) {
	for {
		ch := h.n.C()
		if c := h.Calls(); len(c) >= n {
			return c, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return h.Calls(), fmt.Errorf("pwtest: waiting for %d handler calls (got %v): %w", n, h.Ops(), ctx.Err())
		}
	}
}

// ErrRejected is a convenient error for ValidateErr and RegisterErr.
var ErrRejected = errors.New("rejected by test handler")
