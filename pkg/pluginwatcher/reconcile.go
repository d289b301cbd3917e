package pluginwatcher

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/backoff"
	"github.com/dpkit/dpkit/internal/fswatch"
	"github.com/dpkit/dpkit/internal/unixsock"
)

// Timeouts of the calls to a plugin, as in the kubelet.
const (
	getInfoTimeout = time.Second
	notifyTimeout  = 5 * time.Second
	healthTimeout  = 10 * time.Second
)

// ErrNoHandler is wrapped by the registration error of a plugin whose type
// has no handler.
var ErrNoHandler = errors.New("no handler registered for plugin type")

// loop turns file system events into desired state changes and
// reconciles the desired and actual states every period and whenever
// something changed, until ctx is done; it then waits for the operations
// it started. One goroutine does both, one fewer for each of the
// thousand nodes of a process: reconcile only starts operations, so an
// event waits for none of them.
func (w *Watcher) loop(ctx context.Context, fsw *fswatch.Watch) {
	defer w.ops.Wait()
	defer func() { _ = fsw.Close() }()
	t := w.clock.NewTicker(w.period)
	defer t.Stop()
	for {
		w.reconcile(ctx)
		if !w.next(ctx, t, fsw) {
			return
		}
	}
}

// next handles file system events until the next reconciliation is due:
// the period passed or the desired state changed (kickCh). It returns
// false when the watcher ends.
func (w *Watcher) next(ctx context.Context, t clock.Ticker, fsw *fswatch.Watch) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C():
			return true
		case <-w.kickCh:
			return true
		case ev, ok := <-fsw.Events:
			if !ok {
				return false
			}
			w.handleEvent(fsw, ev)
		case err, ok := <-fsw.Errors:
			if !ok {
				return false
			}
			w.log.Error("File system watcher error", "err", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				w.resync(fsw)
			}
		}
	}
}

// reconcile starts the operations that bring the actual state of the
// world towards the desired one: deregistration of plugins whose socket is
// gone or was re-created, then registration of sockets not registered yet
// whose back-off has expired. At most one operation runs per socket.
func (w *Watcher) reconcile(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.clock.Now()
	for path, r := range w.retries {
		if d, ok := w.desired[path]; !ok || d.gen != r.gen {
			delete(w.retries, path)
		}
	}
	for path, r := range w.actual {
		if w.pending[path] {
			continue
		}
		if d, ok := w.desired[path]; ok && d.gen == r.gen {
			continue
		}
		w.startDeregister(ctx, path, r)
	}
	for path, d := range w.desired {
		if w.pending[path] {
			continue
		}
		if _, ok := w.actual[path]; ok {
			continue
		}
		if r := w.retries[path]; r != nil && now.Before(r.next) {
			continue
		}
		w.startRegister(ctx, path, d)
	}
	if w.healthPeriod > 0 && !now.Before(w.nextHealth) {
		w.nextHealth = now.Add(w.healthPeriod)
		for path, r := range w.actual {
			if !w.pending[path] {
				w.startHealthCheck(ctx, path, r.gen)
			}
		}
		for path := range w.dead {
			if !w.pending[path] {
				w.startProbe(ctx, path)
			}
		}
	}
}

// startRegister and startDeregister mark path pending and run the
// operation in a goroutine that Run waits for. Call them with w.mu held.
// (Separate functions keep the reconcile loop's variables off the heap.)
func (w *Watcher) startRegister(ctx context.Context, path string, d desired) {
	w.pending[path] = true
	w.ops.Add(1)
	go func() {
		defer w.ops.Done()
		w.register(ctx, path, d)
	}()
}

func (w *Watcher) startHealthCheck(ctx context.Context, path string, gen uint64) {
	w.pending[path] = true
	w.ops.Add(1)
	go func() {
		defer w.ops.Done()
		w.healthCheck(ctx, path, gen)
	}()
}

func (w *Watcher) startProbe(ctx context.Context, path string) {
	w.pending[path] = true
	w.ops.Add(1)
	go func() {
		defer w.ops.Done()
		w.probeDead(ctx, path)
	}()
}

func (w *Watcher) startDeregister(ctx context.Context, path string, r registered) {
	w.pending[path] = true
	w.ops.Add(1)
	go func() {
		defer w.ops.Done()
		w.deregister(context.WithoutCancel(ctx), path, r)
	}()
}

// backoff returns the wait after the n-th consecutive failure (n >= 1).
func (w *Watcher) backoff(n int) time.Duration {
	return backoff.Exponential{Initial: w.initialBackoff, Max: w.maxBackoff}.Delay(n)
}

func (w *Watcher) register(ctx context.Context, path string, d desired) {
	var (
		p      Plugin
		h      Handler
		status *registerapi.RegistrationStatus
	)
	conn, err := dial(ctx, path, w.dialTimeout)
	// A dial that failed because nobody listens counts towards
	// RefusedLimit. (The dial itself retries for DialTimeout, which
	// covers a plugin that has bound its socket but not yet listened.)
	isRefused := err != nil && refused(ctx, path)
	if err != nil {
		err = fmt.Errorf("RegisterPlugin error -- dial failed at socket %s, err: %w", path, err)
	} else {
		defer func() { _ = conn.Close() }()
		p, h, status, err = w.attempt(ctx, registerapi.NewRegistrationClient(conn), path)
	}

	// The state is updated before the plugin hears the outcome, so that a
	// plugin told it is registered is listed by Plugins.
	w.mu.Lock()
	delete(w.pending, path)
	switch {
	case err == nil:
		delete(w.retries, path)
		p.Seen = d.seen
		p.Registered = w.clock.Now()
		w.actual[path] = registered{Plugin: p, gen: d.gen, handler: h}
		w.mu.Unlock()
		w.log.Info("Plugin registered", "path", path, "type", p.Type, "name", p.Name, "endpoint", p.Endpoint, "versions", p.Versions)
	case ctx.Err() != nil:
		w.mu.Unlock()
		return
	default:
		r := w.retries[path]
		if r == nil || r.gen != d.gen {
			r = &retry{gen: d.gen}
			w.retries[path] = r
		}
		r.failures++
		r.lastErr = err
		if isRefused {
			r.refused++
		} else {
			r.refused = 0
		}
		if r.refused >= RefusedLimit {
			w.forgetLocked(path, d.gen)
			w.mu.Unlock()
			w.log.Info("Forgetting a plugin socket nobody listens on; it is watched again when re-created", "path", path, "attempts", r.refused)
			break
		}
		n := r.failures
		wait := w.backoff(n)
		r.next = w.clock.Now().Add(wait)
		w.mu.Unlock()
		w.log.Error("Plugin registration failed", "path", path, "failures", n, "retryIn", wait, "err", err)
	}
	w.kick()
	if status != nil {
		w.notify(ctx, registerapi.NewRegistrationClient(conn), path, status)
	}
}

// refused reports whether connecting to the unix socket at path is
// refused: the file is there but no process listens on it (ECONNREFUSED).
// A socket that accepts, times out or is missing is not refused.
func refused(ctx context.Context, path string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
	if err == nil {
		_ = c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// forgetLocked drops the socket at path from the desired state (and its
// retries) if it is still generation gen; the actual state follows on the
// next reconcile, which deregisters a registered plugin. A new event for
// the path (the socket re-created) makes it desired again.
func (w *Watcher) forgetLocked(path string, gen uint64) {
	if d, ok := w.desired[path]; ok && d.gen == gen {
		delete(w.desired, path)
	}
	delete(w.retries, path)
}

// ping dials the socket and calls GetInfo, the kubelet's liveness check.
func (w *Watcher) ping(ctx context.Context, path string) error {
	conn, err := dial(ctx, path, w.dialTimeout)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	if _, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{}); err != nil {
		return fmt.Errorf("GetInfo at socket %s: %w", path, err)
	}
	return nil
}

// healthCheck checks a registered plugin. After HealthFailures failures
// in a row its socket leaves the desired state, so the plugin is
// deregistered, and is probed from then on.
func (w *Watcher) healthCheck(ctx context.Context, path string, gen uint64) {
	err := w.ping(ctx, path)
	gone := err != nil && refused(ctx, path)
	w.mu.Lock()
	defer w.kick()
	defer w.mu.Unlock()
	delete(w.pending, path)
	if ctx.Err() != nil {
		return
	}
	if r, ok := w.actual[path]; !ok || r.gen != gen {
		return
	}
	if err == nil {
		delete(w.health, path)
		return
	}
	if gone {
		// The plugin's process is gone and left its socket file behind:
		// deregister it and stop watching the file until it is
		// re-created, instead of probing it forever.
		delete(w.health, path)
		w.forgetLocked(path, gen)
		w.log.Info("Registered plugin's socket refuses connections; deregistering and forgetting it", "path", path, "err", err)
		return
	}
	w.health[path]++
	n := w.health[path]
	w.log.Warn("Plugin health check failed", "path", path, "failures", n, "err", err)
	if n < HealthFailures {
		return
	}
	delete(w.health, path)
	if d, ok := w.desired[path]; ok && d.gen == gen {
		delete(w.desired, path)
		w.dead[path] = deadSocket{info: d.info, lastErr: err}
		w.log.Error("Plugin stopped answering; deregistering it until it answers again", "path", path, "err", err)
	}
}

// probeDead checks a socket whose plugin stopped answering and puts it
// back in the desired state once the plugin answers.
func (w *Watcher) probeDead(ctx context.Context, path string) {
	err := w.ping(ctx, path)
	gone := err != nil && refused(ctx, path)
	w.mu.Lock()
	defer w.kick()
	defer w.mu.Unlock()
	delete(w.pending, path)
	d, ok := w.dead[path]
	if !ok || ctx.Err() != nil {
		return
	}
	if err != nil {
		if gone {
			delete(w.dead, path)
			w.log.Info("Plugin socket refuses connections; forgetting it until it is re-created", "path", path)
			return
		}
		d.lastErr = err
		w.dead[path] = d
		return
	}
	delete(w.dead, path)
	if _, ok := w.desired[path]; !ok {
		w.nextGen++
		w.desired[path] = desired{seen: w.clock.Now(), gen: w.nextGen, info: d.info}
		w.log.Info("Plugin answers again", "path", path)
	}
}

func (w *Watcher) deregister(ctx context.Context, path string, r registered) {
	w.mu.Lock()
	delete(w.actual, path)
	delete(w.health, path)
	w.mu.Unlock()
	r.handler.DeRegisterPlugin(ctx, r.Name, r.Endpoint)
	w.log.Info("Plugin deregistered", "path", path, "type", r.Type, "name", r.Name, "endpoint", r.Endpoint)
	w.mu.Lock()
	delete(w.pending, path)
	w.mu.Unlock()
	w.kick()
}

// attempt runs one registration of the plugin at path: GetInfo, handler
// lookup, ValidatePlugin and RegisterPlugin. It returns the status to
// send to the plugin (nil when GetInfo failed); its texts are the
// kubelet's.
func (w *Watcher) attempt(ctx context.Context, client registerapi.RegistrationClient, path string) (Plugin, Handler, *registerapi.RegistrationStatus, error) {
	infoCtx, cancel := context.WithTimeout(ctx, getInfoTimeout)
	info, err := client.GetInfo(infoCtx, &registerapi.InfoRequest{})
	cancel()
	if err != nil {
		return Plugin{}, nil, nil, fmt.Errorf("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket %s, err: %w", path, err)
	}
	failed := func(msg string, err error) (Plugin, Handler, *registerapi.RegistrationStatus, error) {
		return Plugin{}, nil, &registerapi.RegistrationStatus{Error: msg}, err
	}

	h := w.handler(info.GetType())
	if h == nil {
		return failed(fmt.Sprintf("RegisterPlugin error -- no handler registered for plugin type: %s at socket %s", info.GetType(), path),
			fmt.Errorf("RegisterPlugin error -- %w: %s at socket %s", ErrNoHandler, info.GetType(), path))
	}
	p := Plugin{
		SocketPath: path,
		Type:       info.GetType(),
		Name:       info.GetName(),
		Endpoint:   info.GetEndpoint(),
		Versions:   info.GetSupportedVersions(),
	}
	if p.Endpoint == "" {
		p.Endpoint = path
	}
	if err := h.ValidatePlugin(ctx, p.Name, p.Endpoint, p.Versions); err != nil {
		return failed(fmt.Sprintf("RegisterPlugin error -- plugin validation failed with err: %v", err),
			fmt.Errorf("RegisterPlugin error -- plugin validation failed: %w", err))
	}
	if err := h.RegisterPlugin(ctx, p.Name, p.Endpoint, p.Versions); err != nil {
		return failed(fmt.Sprintf("RegisterPlugin error -- plugin registration failed with err: %v", err),
			fmt.Errorf("RegisterPlugin error -- plugin registration failed: %w", err))
	}
	// The handler has accepted the plugin; failing to tell the plugin does
	// not undo that, as in the kubelet.
	return p, h, &registerapi.RegistrationStatus{PluginRegistered: true}, nil
}

// notify sends the registration status to the plugin and logs a failure.
func (w *Watcher) notify(ctx context.Context, client registerapi.RegistrationClient, path string, st *registerapi.RegistrationStatus) {
	ctx, cancel := context.WithTimeout(ctx, notifyTimeout)
	defer cancel()
	if _, err := client.NotifyRegistrationStatus(ctx, st); err != nil {
		w.log.Warn("Cannot send registration status to plugin", "path", path, "registered", st.PluginRegistered, "err", err)
	}
}

// dial connects to the unix socket at path and waits until the
// connection is ready or timeout expires.
func dial(ctx context.Context, path string, timeout time.Duration) (*grpc.ClientConn, error) {
	conn, err := unixsock.NewGRPCClient(path)
	if err != nil {
		return nil, fmt.Errorf("failed to dial socket %s, err: %w", path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := unixsock.WaitReady(ctx, conn); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("failed to dial socket %s, err: %w", path, err)
	}
	return conn, nil
}
