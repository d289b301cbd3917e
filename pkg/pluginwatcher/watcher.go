// Package pluginwatcher discovers plugins the way the kubelet's plugin
// manager does: it watches a registration directory (the kubelet's
// <root>/plugins_registry) for unix sockets, asks every new socket who it is
// through the pluginregistration v1 API (GetInfo), hands it to the Handler
// registered for its type (ValidatePlugin, RegisterPlugin), reports the
// outcome back to the plugin (NotifyRegistrationStatus) and deregisters it
// once the socket disappears.
//
// Internally it keeps a desired state of the world (the sockets that exist,
// each with the time it was seen) and an actual state of the world (the
// plugins registered with a handler) and reconciles them in a loop, with
// an exponential back-off per socket after a failure.
package pluginwatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/clock"
)

// Defaults applied by New to a zero Config field.
const (
	DefaultReconcilePeriod = time.Second
	DefaultInitialBackoff  = 500 * time.Millisecond
	DefaultMaxBackoff      = 2*time.Minute + 2*time.Second
	DefaultDialTimeout     = 10 * time.Second
	DefaultHealthPeriod    = 10 * time.Second
	// HealthFailures is how many consecutive failed health checks make a
	// registered plugin count as gone.
	HealthFailures = 2
	// RefusedLimit is how many registration attempts in a row (each a dial
	// of up to DialTimeout, then the back-off) must find
	// nobody listening on a socket before the watcher forgets it. A socket
	// file whose process died (a plugin killed in a crash loop leaves one
	// behind each time) refuses connections; without this it would be
	// retried forever, one dial per back-off, each costing goroutines.
	RefusedLimit = 3
)

// Config configures a Watcher.
type Config struct {
	// Dir is the directory watched for plugin sockets, with its
	// subdirectories. It is created if it does not exist.
	Dir string
	// Handlers maps plugin types (DevicePlugin, CSIPlugin, DRAPlugin or
	// any other string) to their handlers. More can be added with
	// AddHandler.
	Handlers map[string]Handler
	// Logger receives the watcher's logs. Nil discards them.
	Logger *slog.Logger
	// ReconcilePeriod is how often the desired and actual states are
	// compared even when no file system event arrived. Default 1s.
	ReconcilePeriod time.Duration
	// InitialBackoff is the wait after a socket's first failed
	// registration; it doubles with every further failure up to
	// MaxBackoff. Defaults 500ms and 2m2s, as in the kubelet.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// DialTimeout bounds connecting to a plugin socket. Default 10s.
	DialTimeout time.Duration
	// HealthPeriod is how often registered plugins are asked GetInfo.
	// After HealthFailures failures in a row a plugin is deregistered
	// although its socket stays; its socket is then probed every period
	// and the plugin registered again once it answers. Default 10s, as
	// the kubelet's connection monitor; negative turns checks off.
	HealthPeriod time.Duration
	// Clock is the time source. Default the real clock.
	Clock clock.WithTicker
}

// Validate reports every problem in c, each with its field path.
func (c *Config) Validate() error {
	var errs field.ErrorList
	if c.Dir == "" {
		errs = append(errs, field.Required(field.NewPath("dir"), "set the plugin registration directory to watch, for example <kubelet root>/plugins_registry"))
	}
	for typ, h := range c.Handlers {
		if typ == "" {
			errs = append(errs, field.Invalid(field.NewPath("handlers").Key(typ), typ, "plugin type must not be empty"))
		}
		if h == nil {
			errs = append(errs, field.Required(field.NewPath("handlers").Key(typ), "handler must not be nil"))
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"reconcilePeriod", c.ReconcilePeriod},
		{"initialBackoff", c.InitialBackoff},
		{"maxBackoff", c.MaxBackoff},
		{"dialTimeout", c.DialTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, field.Invalid(field.NewPath(d.name), d.v.String(), "must not be negative; leave it zero for the default"))
		}
	}
	if c.InitialBackoff > 0 && c.MaxBackoff > 0 && c.MaxBackoff < c.InitialBackoff {
		errs = append(errs, field.Invalid(field.NewPath("maxBackoff"), c.MaxBackoff.String(), "must not be smaller than initialBackoff"))
	}
	return errs.ToAggregate()
}

// Plugin is a plugin registered with its handler.
type Plugin struct {
	// SocketPath is the registration socket the plugin was found at.
	SocketPath string `json:"socketPath"`
	// Type, Name, Endpoint and Versions are what the plugin answered to
	// GetInfo; Endpoint is SocketPath when the plugin left it empty.
	Type     string   `json:"type"`
	Name     string   `json:"name"`
	Endpoint string   `json:"endpoint"`
	Versions []string `json:"versions,omitempty"`
	// Seen is when the watcher saw the socket appear.
	Seen time.Time `json:"seen"`
	// Registered is when the handler accepted the plugin.
	Registered time.Time `json:"registered"`
}

// Failure describes a socket whose registration failed and will be
// retried.
type Failure struct {
	SocketPath string `json:"socketPath"`
	// Failures counts consecutive failed attempts for this socket.
	Failures int `json:"failures"`
	// LastError is the last attempt's error.
	LastError string `json:"lastError"`
	// NextAttempt is the earliest time of the next attempt.
	NextAttempt time.Time `json:"nextAttempt"`
}

// ErrAlreadyStarted is returned by Start and Run on a Watcher that was
// started before.
var ErrAlreadyStarted = errors.New("pluginwatcher: already started")

// desired is a socket in the desired state of the world.
type desired struct {
	seen time.Time
	gen  uint64
	info os.FileInfo
}

// registered is a plugin in the actual state of the world.
type registered struct {
	Plugin
	gen     uint64
	handler Handler
}

// retry is the back-off state of one socket generation.
type retry struct {
	gen      uint64
	failures int
	// refused counts consecutive attempts that found nobody listening.
	refused int
	next    time.Time
	lastErr error
}

// Watcher watches a plugin registration directory. Create it with New.
type Watcher struct {
	dir            string
	log            *slog.Logger
	clock          clock.WithTicker
	period         time.Duration
	initialBackoff time.Duration
	maxBackoff     time.Duration
	dialTimeout    time.Duration
	healthPeriod   time.Duration

	started atomic.Bool
	done    chan struct{}
	kickCh  chan struct{}
	ops     sync.WaitGroup

	mu       sync.Mutex
	handlers map[string]Handler
	desired  map[string]desired
	actual   map[string]registered
	pending  map[string]bool
	retries  map[string]*retry
	nextGen  uint64
	// health counts consecutive failed health checks of registered
	// plugins; dead holds sockets deregistered for failing them.
	health     map[string]int
	dead       map[string]deadSocket
	nextHealth time.Time
}

// deadSocket is a socket whose plugin stopped answering.
type deadSocket struct {
	info    os.FileInfo
	lastErr error
}

// New validates cfg, applies defaults and returns a Watcher that is not
// started yet.
func New(cfg Config) (*Watcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("pluginwatcher: invalid config: %w", err)
	}
	w := &Watcher{
		dir:            cfg.Dir,
		log:            cfg.Logger,
		clock:          cfg.Clock,
		period:         cmpOr(cfg.ReconcilePeriod, DefaultReconcilePeriod),
		initialBackoff: cmpOr(cfg.InitialBackoff, DefaultInitialBackoff),
		maxBackoff:     cmpOr(cfg.MaxBackoff, DefaultMaxBackoff),
		dialTimeout:    cmpOr(cfg.DialTimeout, DefaultDialTimeout),
		healthPeriod:   cmpOr(cfg.HealthPeriod, DefaultHealthPeriod),
		done:           make(chan struct{}),
		kickCh:         make(chan struct{}, 1),
		handlers:       make(map[string]Handler, len(cfg.Handlers)),
		desired:        make(map[string]desired),
		actual:         make(map[string]registered),
		pending:        make(map[string]bool),
		retries:        make(map[string]*retry),
		health:         make(map[string]int),
		dead:           make(map[string]deadSocket),
	}
	if w.maxBackoff < w.initialBackoff {
		w.maxBackoff = w.initialBackoff
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	for typ, h := range cfg.Handlers {
		w.handlers[typ] = h
	}
	return w, nil
}

func cmpOr(v, def time.Duration) time.Duration {
	if v == 0 {
		return def
	}
	return v
}

// AddHandler registers h for plugins of pluginType, replacing any handler
// registered for it before. It may be called before or after Start;
// sockets that failed for lack of a handler are retried at once.
func (w *Watcher) AddHandler(pluginType string, h Handler) error {
	if pluginType == "" {
		return errors.New("pluginwatcher: AddHandler: plugin type must not be empty")
	}
	if h == nil {
		return fmt.Errorf("pluginwatcher: AddHandler: handler for %q must not be nil", pluginType)
	}
	w.mu.Lock()
	w.handlers[pluginType] = h
	for path, r := range w.retries {
		if errors.Is(r.lastErr, ErrNoHandler) {
			delete(w.retries, path)
		}
	}
	w.mu.Unlock()
	w.kick()
	return nil
}

func (w *Watcher) handler(pluginType string) Handler {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.handlers[pluginType]
}

// Start creates the directory if needed, starts watching it, scans the
// sockets already there and starts the reconcile loop. It returns once
// watching has begun; the watcher's goroutines run until ctx is done, and
// Done is closed once they all returned.
func (w *Watcher) Start(ctx context.Context) error {
	if w.started.Swap(true) {
		return ErrAlreadyStarted
	}
	fsw, err := w.startFS()
	if err != nil {
		close(w.done)
		return err
	}
	go func() {
		defer close(w.done)
		w.loop(ctx, fsw)
	}()
	return nil
}

// Run starts the watcher and blocks until ctx is done and every goroutine
// it started has returned. It returns an error only if watching could not
// start.
func (w *Watcher) Run(ctx context.Context) error {
	if err := w.Start(ctx); err != nil {
		return err
	}
	<-w.done
	return nil
}

// Done is closed once a started watcher has stopped.
func (w *Watcher) Done() <-chan struct{} { return w.done }

// Plugins returns the plugins registered with their handlers, sorted by
// socket path.
func (w *Watcher) Plugins() []Plugin {
	w.mu.Lock()
	out := make([]Plugin, 0, len(w.actual))
	for _, r := range w.actual {
		p := r.Plugin
		p.Versions = slices.Clone(p.Versions)
		out = append(out, p)
	}
	w.mu.Unlock()
	slices.SortFunc(out, func(a, b Plugin) int { return strings.Compare(a.SocketPath, b.SocketPath) })
	return out
}

// Failures returns the sockets whose registration failed and is retried,
// sorted by socket path.
func (w *Watcher) Failures() []Failure {
	w.mu.Lock()
	out := make([]Failure, 0, len(w.retries))
	for path, r := range w.retries {
		if d, ok := w.desired[path]; !ok || d.gen != r.gen {
			continue
		}
		out = append(out, Failure{SocketPath: path, Failures: r.failures, LastError: r.lastErr.Error(), NextAttempt: r.next})
	}
	for path, d := range w.dead {
		out = append(out, Failure{SocketPath: path, Failures: HealthFailures, LastError: d.lastErr.Error(), NextAttempt: w.nextHealth})
	}
	w.mu.Unlock()
	slices.SortFunc(out, func(a, b Failure) int { return strings.Compare(a.SocketPath, b.SocketPath) })
	return out
}

// kick asks the reconcile loop for a pass without waiting for its period.
func (w *Watcher) kick() {
	select {
	case w.kickCh <- struct{}{}:
	default:
	}
}
