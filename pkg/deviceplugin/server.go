package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/internal/fswatch"
)

// Server serves a set of resources to the kubelet. Create it with
// NewServer and start it with Run.
type Server struct {
	cfg       Config
	mode      RegistrationMode
	resources []*resource
	metrics   *metrics

	mu      sync.Mutex
	running bool
	changed broadcast.Change // a registration changed
}

// NewServer validates cfg and resources and returns a Server ready to Run.
// It reports every problem at once.
func NewServer(cfg Config, resources ...Resource) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(resources); err != nil {
		return nil, fmt.Errorf("invalid device plugin server configuration:\n%w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s := &Server{cfg: cfg, mode: cfg.registryMode(), metrics: m}
	for _, res := range resources {
		r := newResource(res, cfg, s.mode, m)
		r.onRegister = s.registrationChanged
		s.resources = append(s.resources, r)
	}
	return s, nil
}

// Serve is a shortcut that serves one resource with cfg until ctx ends.
func Serve(ctx context.Context, cfg Config, name string, p Plugin) error {
	s, err := NewServer(cfg, Resource{Name: name, Plugin: p})
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// Mode is the registration mode in use (auto resolved).
func (s *Server) Mode() RegistrationMode { return s.mode }

// Run serves every resource until ctx ends, then shuts down: streams end,
// in-flight calls finish, sockets are removed. It returns an error only
// when serving cannot start at all (an unusable socket directory); failures
// to reach the kubelet are retried forever.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("device plugin server is already running")
	}
	s.running = true
	s.mu.Unlock()

	log := s.cfg.Logger
	// In process, there is no socket to serve nor directory to watch:
	// nil channels, never ready.
	var events <-chan fsnotify.Event
	var watchErrs <-chan error
	if s.mode != RegistrationInProcess {
		watcher, err := s.listen()
		if err != nil {
			return err
		}
		defer watcher.Close()
		events, watchErrs = watcher.Events, watcher.Errors
	} else {
		log.Info("Device plugin server started", "resources", s.names(), "registration", string(s.mode))
	}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range s.resources {
		wg.Add(1)
		go func() { defer wg.Done(); r.scan(ctx) }()
		// In registry mode the kubelet's plugin watcher finds the socket
		// served above and sets the registered state itself
		// (NotifyRegistrationStatus); a loop of ours there could only
		// race it.
		if s.mode == RegistrationKubelet || s.mode == RegistrationInProcess {
			r.registration.Start(ctx, r.registerLoop, nil)
			r.requestRegistration(reasonStart)
		}
	}

	ticker := s.cfg.Clock.NewTicker(s.cfg.ResyncInterval)
	defer ticker.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case ev, ok := <-events:
			if !ok {
				break loop
			}
			s.handleEvent(ev)
		case err, ok := <-watchErrs:
			if !ok {
				break loop
			}
			log.Warn("File watch error", "err", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				s.resync() // events were lost: look now, not at the next tick
			}
		case <-ticker.C():
			s.resync()
		}
	}
	cancel()
	wg.Wait()
	for _, r := range s.resources {
		r.registration.Stop()
	}
	var swg sync.WaitGroup
	for _, r := range s.resources {
		swg.Add(1)
		go func() { defer swg.Done(); r.shutdown() }()
	}
	swg.Wait()
	log.Info("Device plugin server stopped")
	return nil
}

// listen serves every resource's socket and watches the directories
// whose changes ask for a new socket or registration.
func (s *Server) listen() (*fswatch.Watch, error) {
	dir := s.cfg.PluginDir
	if s.mode == RegistrationRegistry {
		dir = s.cfg.RegistryDir
	}
	// What failed leaves no socket served behind.
	fail := func(err error) (*fswatch.Watch, error) {
		for _, r := range s.resources {
			r.shutdown()
		}
		return nil, err
	}
	for _, r := range s.resources {
		if err := r.listen(); err != nil {
			return fail(fmt.Errorf("serve %s: %w", r.name, err))
		}
	}
	watcher, err := fswatch.New()
	if err != nil {
		return fail(fmt.Errorf("watch %s: %w", dir, err))
	}
	watchDirs := []string{dir}
	if s.mode == RegistrationKubelet {
		if kd := filepath.Dir(s.cfg.KubeletSocket); kd != dir {
			watchDirs = append(watchDirs, kd)
		}
	}
	for _, d := range watchDirs {
		if err := watcher.Add(d); err != nil {
			_ = watcher.Close()
			return fail(fmt.Errorf("watch %s: %w", d, err))
		}
	}
	s.cfg.Logger.Info("Device plugin server started", "resources", s.names(), "registration", string(s.mode), "socketDir", dir)
	return watcher, nil
}

func (s *Server) handleEvent(ev fsnotify.Event) {
	switch {
	case s.mode == RegistrationKubelet && ev.Name == s.cfg.KubeletSocket && ev.Has(fsnotify.Create):
		s.cfg.Logger.Info("Kubelet socket created; the kubelet restarted")
		for _, r := range s.resources {
			r.requestRegistration(reasonKubeletSocket)
		}
	case ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename):
		for _, r := range s.resources {
			if ev.Name != r.socket() {
				continue
			}
			switch relistened, err := r.relisten(); {
			case err != nil:
				r.log.Error("Could not serve the socket again; will retry", "err", err)
				s.registerAgain(r, reasonSocketRemoved)
			case relistened:
				r.log.Info("Plugin socket was removed; serving it again")
				s.registerAgain(r, reasonSocketRemoved)
			}
		}
	}
}

// resync is the safety net behind fsnotify: it puts back sockets whose
// removal was missed and retries registrations that are not in place.
func (s *Server) resync() {
	for _, r := range s.resources {
		if s.mode != RegistrationInProcess {
			if relistened, err := r.relisten(); relistened {
				if err == nil {
					s.registerAgain(r, reasonSocketRemoved)
				}
				continue
			}
		}
		if (s.mode == RegistrationKubelet || s.mode == RegistrationInProcess) && !r.isRegistered() {
			r.requestRegistration(reasonRetry)
		}
	}
}

// registerAgain makes r known to the kubelet again after its socket was
// served anew: in kubelet mode by the registration loop; in registry mode
// the plugin watcher finds the new socket by itself, and the old socket's
// server is stopped at once (the watcher dropped it with its file).
func (s *Server) registerAgain(r *resource, reason string) {
	if s.mode == RegistrationKubelet {
		r.requestRegistration(reason)
		return
	}
	r.metrics.reregistration(r.name, reason)
	r.stopRetired()
}

func (s *Server) names() []string {
	names := make([]string, len(s.resources))
	for i, r := range s.resources {
		names[i] = r.name
	}
	return names
}

// ResourceStatus describes one resource's registration.
type ResourceStatus struct {
	Name       string
	Socket     string
	Registered bool
	Streams    int
	Healthy    int
	Unhealthy  int
	// MessageBytes is the encoded size of the ListAndWatch message.
	MessageBytes int
	LastError    error
}

// Status reports every resource's state, sorted by name.
func (s *Server) Status() []ResourceStatus {
	out := make([]ResourceStatus, 0, len(s.resources))
	for _, r := range s.resources {
		snap := r.devices.current()
		r.mu.Lock()
		out = append(out, ResourceStatus{
			Name: r.name, Socket: r.socketPath, Registered: r.registered, Streams: r.streams,
			Healthy: snap.healthy, Unhealthy: snap.unhealthy, MessageBytes: snap.size, LastError: r.lastErr,
		})
		r.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Ready returns nil when every resource is registered with the kubelet and
// its device list fits the kubelet's 4 MiB ListAndWatch limit, and
// otherwise an error naming those that are not. A kubelet drops a stream
// whose message is larger (and the plugin's devices with it) even though
// the registration succeeded, so such a plugin is not ready.
func (s *Server) Ready() error {
	var missing, tooBig []string
	for _, st := range s.Status() {
		if !st.Registered {
			missing = append(missing, st.Name)
		}
		if st.MessageBytes > KubeletMaxMessageSize {
			tooBig = append(tooBig, fmt.Sprintf("%s (%d bytes)", st.Name, st.MessageBytes))
		}
	}
	var errs []error
	if len(missing) > 0 {
		errs = append(errs, fmt.Errorf("not registered with the kubelet: %s", strings.Join(missing, ", ")))
	}
	if len(tooBig) > 0 {
		errs = append(errs, fmt.Errorf("device list over the kubelet's %d-byte ListAndWatch limit, which the kubelet drops: %s; split the devices over several resources or shorten their IDs",
			KubeletMaxMessageSize, strings.Join(tooBig, ", ")))
	}
	return errors.Join(errs...)
}

func (s *Server) registrationChanged() { s.changed.Broadcast() }

// WaitReady waits until every resource is registered with the kubelet, or
// ctx ends.
func (s *Server) WaitReady(ctx context.Context) error {
	for {
		ch := s.changed.C()
		err := s.Ready()
		if err == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w", ctx.Err(), err)
		}
	}
}
