package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/backoff"
	"github.com/dpkit/dpkit/internal/ondemand"
	"github.com/dpkit/dpkit/internal/unixsock"
)

// serverMaxRecvMsgSize is how large a request the plugin accepts. The gRPC
// default of 4 MiB would refuse GetPreferredAllocation requests listing
// tens of thousands of available devices.
const serverMaxRecvMsgSize = 64 << 20

type streamEnd int

const (
	streamEndedByServer streamEnd = iota
	streamEndedByKubelet
)

// Reasons a resource registers again; they label the re-registration metric.
const (
	reasonStart         = "start"
	reasonKubeletSocket = "kubelet-socket-created"
	reasonSocketRemoved = "plugin-socket-removed"
	reasonStreamEnded   = "stream-ended"
	reasonRetry         = "retry"
)

// resource serves one Resource: its socket, its gRPC server, its device
// set and its registration with the kubelet.
type resource struct {
	name      string
	plugin    Plugin
	preferred PreferredAllocator
	prestart  PreStarter
	cfg       Config
	mode      RegistrationMode
	// sockBase is the socket path without ".sock": the resource's name and
	// the instance ID in the plugin (or registry) directory.
	sockBase string
	log      *slog.Logger
	metrics  *metrics
	devices  *deviceSet

	stopping chan struct{} // closed when the server shuts down
	trigger  chan struct{} // wakes the registration loop in a back-off; reasons are in pending
	scanned  chan struct{} // closed on the first snapshot
	scanOnce sync.Once
	// registration runs the registration loop while reasons are pending
	// (kubelet and in-process modes).
	registration ondemand.Loop
	// firstScanBy is when waiting for the first snapshot ends
	// (awaitFirstScan), set by the first wait; guarded by mu.
	firstScanBy time.Time

	// relistenMu makes relisten's "is the socket still ours? if not,
	// listen again" one step: the fsnotify handler, the registration loop
	// and the resync all ask, and two of them listening for one removal
	// would close the socket the other has just registered.
	relistenMu sync.Mutex

	mu      sync.Mutex
	pending map[string]bool // reasons to register that the loop has not seen
	// socketPath is the socket served now, and srv the gRPC server on it.
	// Each listen serves a fresh path from a fresh server (see listen).
	socketPath string
	srv        *grpc.Server
	// retired are the servers of earlier sockets, stopped once the new
	// socket is registered.
	retired    []*grpc.Server
	listens    int
	ln         net.Listener
	socketInfo os.FileInfo // the socket file this instance created
	registered bool
	// kubeletSock is the kubelet.sock the last successful registration went
	// to, so a creation event for that same socket is not a restart.
	kubeletSock os.FileInfo
	streams     int
	// registeredAt is when the last registration succeeded, and
	// registeredListen the listen whose socket it registered.
	registeredAt     time.Time
	registeredListen int
	lastErr          error
	onRegister       func() // called after every registration state change
	// refused is the error of the last device list notify refused, ""
	// once a list is accepted.
	refused string
}

func newResource(res Resource, cfg Config, mode RegistrationMode, m *metrics) *resource {
	r := &resource{
		name:     res.Name,
		plugin:   res.Plugin,
		cfg:      cfg,
		mode:     mode,
		log:      cfg.Logger.With("resource", res.Name),
		metrics:  m,
		stopping: make(chan struct{}),
		trigger:  make(chan struct{}, 1),
		scanned:  make(chan struct{}),
	}
	r.preferred, _ = res.Plugin.(PreferredAllocator)
	r.prestart, _ = res.Plugin.(PreStarter)
	dir := cfg.PluginDir
	if mode == RegistrationRegistry {
		dir = cfg.RegistryDir
	}
	if mode != RegistrationInProcess {
		r.sockBase = filepath.Join(dir, socketBase(res.Name)+"-"+cfg.InstanceID)
		r.socketPath = r.sockBase + ".sock"
	}
	r.devices = newDeviceSet(r.snapshotChanged)
	return r
}

// newServer returns a gRPC server with the plugin's services.
func (r *resource) newServer() *grpc.Server {
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(serverMaxRecvMsgSize))
	pluginapi.RegisterDevicePluginServer(srv, service{r: r})
	if r.mode == RegistrationRegistry {
		registerapi.RegisterRegistrationServer(srv, registrationService{r: r, listen: r.listens + 1})
	}
	return srv
}

// socket returns the path of the socket served now.
func (r *resource) socket() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.socketPath
}

func (r *resource) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{
		PreStartRequired:                r.prestart != nil,
		GetPreferredAllocationAvailable: r.preferred != nil,
	}
}

// notify is handed to Plugin.Scan. A list that names a device ID twice is
// refused as a whole and logged as an error: the devices last accepted
// stay (none, before the first list is accepted, and the first
// registration then waits FirstScanWait as for a Scan that has not called
// notify). notify returns nothing, so the log and the missing devices are
// what the author sees; an unchanged refusal is logged once.
func (r *resource) notify(devs []Device) {
	if err := checkDevices(devs); err != nil {
		r.mu.Lock()
		repeated := r.refused == err.Error()
		r.refused = err.Error()
		r.mu.Unlock()
		level := slog.LevelError
		if repeated {
			level = slog.LevelDebug
		}
		r.log.Log(context.Background(), level, logDevicesRefused, "err", err, "devices", len(devs))
		return
	}
	r.mu.Lock()
	r.refused = ""
	r.mu.Unlock()
	r.devices.update(devs)
	r.scanOnce.Do(func() { close(r.scanned) })
}

// logDevicesRefused is the message of the error notify logs when it
// refuses a device list. dpkit verify looks for it in a plugin's output.
const logDevicesRefused = "Device list refused: a device ID is listed twice; the devices last accepted stay advertised"

func (r *resource) snapshotChanged(s *snapshot) {
	r.metrics.setDevices(r.name, s.healthy, s.unhealthy)
	r.metrics.setMessageBytes(r.name, s.size)
	r.log.Debug("Devices changed", "healthy", s.healthy, "unhealthy", s.unhealthy, "messageBytes", s.size)
	switch {
	case s.size > KubeletMaxMessageSize:
		r.log.Error("ListAndWatch message exceeds the kubelet's 4 MiB receive limit; the kubelet will drop the stream. Split the devices over several resources or shorten their IDs",
			"devices", len(s.byID), "bytes", s.size, "limit", KubeletMaxMessageSize)
	case s.size > KubeletMaxMessageSize*3/4:
		r.log.Warn("ListAndWatch message is above 75% of the kubelet's 4 MiB receive limit",
			"devices", len(s.byID), "bytes", s.size, "limit", KubeletMaxMessageSize)
	}
}

// scan runs the plugin's Scan until ctx ends, restarting it with back-off
// when it fails.
func (r *resource) scan(ctx context.Context) {
	b := backoff.Retry{Exponential: backoff.Exponential{Initial: r.cfg.RetryMin, Max: r.cfg.RetryMax}, Jitter: true}
	for {
		err := r.plugin.Scan(ctx, r.notify)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			r.log.Debug("Scan finished; the device set is final")
			return
		}
		wait := b.Next()
		r.log.Error("Scan failed; retrying", "err", err, "retryIn", wait)
		if !r.sleep(ctx, wait) {
			return
		}
	}
}

// listen serves the resource on a socket. The first call serves
// <name>-<instance>.sock; each later one (the socket was deleted while the
// plugin ran) serves a fresh path, <name>-<instance>-<n>.sock, from a fresh
// gRPC server. A kubelet refuses a second registration of an endpoint it
// is still connected to ("device plugin already connected"), and the
// connection to the old socket outlives the file: re-serving the same path
// would leave the kubelet holding a stale endpoint that keeps the devices
// advertised after the plugin exits. The previous server is retired and
// stopped once the new socket is registered (stopRetired), which ends the
// kubelet's old connection. The previous socket file is not unlinked: its
// path may already be somebody else's file.
func (r *resource) listen() error {
	r.mu.Lock()
	first := r.listens == 0
	r.mu.Unlock()
	if first {
		r.removeStaleSockets()
	}
	r.mu.Lock()
	unregistered, err := r.listenLocked()
	r.mu.Unlock()
	if unregistered {
		r.registrationChanged()
	}
	return err
}

// relisten serves the resource on a fresh socket unless the socket file
// on disk is still the one this instance serves, and reports whether it
// did. Without it, two callers that saw the same removal would both listen:
// the second listen closes the first's socket, which one of them may be
// registering at that moment, and the kubelet's dial inside Register then
// finds nobody there ("connection refused") for its whole 10s.
func (r *resource) relisten() (bool, error) {
	r.relistenMu.Lock()
	defer r.relistenMu.Unlock()
	if r.ownsSocket() {
		return false, nil
	}
	return true, r.listen()
}

// listenLocked does listen's work with r.mu held and reports whether it
// cleared the registered state.
func (r *resource) listenLocked() (unregistered bool, _ error) {
	path := r.sockBase + ".sock"
	if r.listens > 0 {
		path = fmt.Sprintf("%s-%d.sock", r.sockBase, r.listens)
	}
	ln, fi, err := listenUnix(path)
	if err != nil {
		return false, err
	}
	if r.srv != nil {
		// Closing the listener makes the old server's Serve return; its
		// connections stay until stopRetired.
		_ = r.ln.Close()
		r.retired = append(r.retired, r.srv)
	}
	srv := r.newServer()
	r.listens++
	r.srv, r.ln, r.socketInfo, r.socketPath = srv, ln, fi, path
	if r.mode == RegistrationRegistry && r.registered {
		// A new socket is unknown to the plugin watcher until it calls
		// GetInfo and NotifyRegistrationStatus on it. Say so now, before
		// serving, so that notification cannot be overtaken.
		r.registered = false
		unregistered = true
	}
	go func() { _ = srv.Serve(ln) }()
	r.log.Debug("Serving", "socket", path)
	return unregistered, nil
}

// afterListen, when set by a test, runs between listenUnix's listen and
// stat.
var afterListen func(path string)

// listenUnix listens on path and returns the socket file's identity. A
// kubelet that starts empties the device plugin directory; a socket it
// removed between the listen and the stat is made again (a few times: each
// time is a new kubelet start, or a directory being cleared by something
// that is not a kubelet).
func listenUnix(path string) (net.Listener, os.FileInfo, error) {
	for attempt := 1; ; attempt++ {
		ln, err := unixsock.Listen(path)
		if err != nil {
			return nil, nil, fmt.Errorf("listen on %s: %w", path, err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		if afterListen != nil {
			afterListen(path)
		}
		fi, err := os.Stat(path)
		if err == nil {
			return ln, fi, nil
		}
		_ = ln.Close()
		if !errors.Is(err, fs.ErrNotExist) || attempt == 5 {
			return nil, nil, fmt.Errorf("stat %s: %w", path, err)
		}
	}
}

// removeStaleSockets removes the sockets of earlier instances of this
// resource's plugin that nobody listens on any more: a plugin killed in a
// crash loop leaves one behind each time, which the kubelet's plugin
// watcher would otherwise keep trying. A socket that accepts connections
// belongs to a live instance (a rolling update runs two at once) and is
// never touched.
func (r *resource) removeStaleSockets() {
	prefix := filepath.Base(r.sockBase)
	prefix = prefix[:len(prefix)-len(r.cfg.InstanceID)]
	matches, err := filepath.Glob(filepath.Join(filepath.Dir(r.sockBase), prefix+"*.sock"))
	if err != nil {
		return
	}
	for _, path := range matches {
		if strings.HasPrefix(filepath.Base(path), filepath.Base(r.sockBase)) {
			continue // this instance's own
		}
		if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
			continue // not a socket (nor a link to one): not ours to judge
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			_ = c.Close()
			continue
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			continue
		}
		if err := os.Remove(path); err == nil {
			r.log.Info("Removed a stale socket of an earlier instance", "socket", path)
		}
	}
}

// stopRetired stops the servers of earlier sockets, ending their
// connections: the kubelet then drops the old endpoint.
func (r *resource) stopRetired() {
	r.mu.Lock()
	retired := r.retired
	r.retired = nil
	r.mu.Unlock()
	for _, srv := range retired {
		srv.Stop()
	}
}

// ownsSocket reports whether the socket file on disk is the one this
// instance created.
func (r *resource) ownsSocket() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ownsSocketLocked()
}

func (r *resource) ownsSocketLocked() bool {
	if r.socketInfo == nil {
		return false
	}
	fi, err := os.Stat(r.socketPath)
	return err == nil && os.SameFile(fi, r.socketInfo)
}

// shutdown ends every stream, lets in-flight calls finish within the
// shutdown timeout, and removes the socket if it is still ours.
func (r *resource) shutdown() {
	close(r.stopping)
	r.devices.endPushed()
	r.stopRetired()
	r.mu.Lock()
	srv, path := r.srv, r.socketPath
	r.mu.Unlock()
	if srv != nil {
		done := make(chan struct{})
		go func() { srv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-r.cfg.Clock.After(r.cfg.ShutdownTimeout):
			r.log.Warn("In-flight calls did not finish in time; closing them", "timeout", r.cfg.ShutdownTimeout)
			srv.Stop()
			<-done
		}
	}
	owned := r.ownsSocket()
	r.mu.Lock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	r.mu.Unlock()
	if owned {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("Could not remove socket", "socket", path, "err", err)
		}
	}
	r.setRegistered(false, nil)
}

// requestRegistration asks the registration loop to register again for
// reason. Reasons accumulate until the loop takes them, so none is lost.
func (r *resource) requestRegistration(reason string) {
	r.mu.Lock()
	if r.pending == nil {
		r.pending = make(map[string]bool)
	}
	r.pending[reason] = true
	r.mu.Unlock()
	r.registration.Ensure()
	select {
	case r.trigger <- struct{}{}: // a loop in a back-off retries at once
	default: // the loop is already woken and will take every pending reason
	}
}

// hasPending reports whether a reason to register waits for the loop.
func (r *resource) hasPending() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.pending) > 0
}

// takeReasons returns the pending reasons that still call for a
// registration, and clears them all.
func (r *resource) takeReasons() []string {
	r.mu.Lock()
	pending := r.pending
	r.pending = nil
	r.mu.Unlock()
	var out []string
	for _, reason := range []string{reasonStart, reasonKubeletSocket, reasonSocketRemoved, reasonStreamEnded, reasonRetry} {
		if pending[reason] && r.needsRegistration(reason) {
			out = append(out, reason)
		}
	}
	return out
}

func (r *resource) streamOpened() {
	r.mu.Lock()
	r.streams++
	r.mu.Unlock()
	r.metrics.streamDelta(r.name, 1)
}

func (r *resource) streamClosed(end streamEnd) {
	r.mu.Lock()
	r.streams--
	last := r.streams == 0
	r.mu.Unlock()
	r.metrics.streamDelta(r.name, -1)
	// The kubelet ended the last stream: it is restarting, or dropped this
	// plugin. Either way the plugin must register again to be seen. The
	// registration loop checks again before acting, so a stream that ends
	// while a newer one is already open does not cause a storm.
	if end == streamEndedByKubelet && last && (r.mode == RegistrationKubelet || r.mode == RegistrationInProcess) {
		r.requestRegistration(reasonStreamEnded)
	}
	if end == streamEndedByKubelet && last && r.mode == RegistrationRegistry && r.isRegistered() {
		go r.reannounce()
	}
}

// reannounce makes the plugin watcher register the resource again after
// the kubelet ended the last ListAndWatch stream of a registered plugin
// that still serves. Kubelets v1.34 to v1.36 do that to the newest
// instance of a plugin when an older one exits (a DaemonSet rolled with
// maxSurge; kubernetes#121994, fixed in v1.37) and then keep the
// resource at 0 until the plugin registers again. The socket is served
// under a new name, which the watcher takes for a new plugin; the old file
// is removed first, so that the watcher's deregistration of it (which
// those kubelets apply to whichever client holds the resource name) comes
// before the new registration. Only a registered plugin does it, so a
// kubelet that keeps ending new streams cannot make it loop.
func (r *resource) reannounce() {
	r.relistenMu.Lock()
	defer r.relistenMu.Unlock()
	select {
	case <-r.stopping:
		return
	default:
	}
	if r.ownsSocket() {
		if err := os.Remove(r.socket()); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("Could not remove the socket to register again", "err", err)
		}
	}
	if err := r.listen(); err != nil {
		r.log.Error("Could not serve a new socket to register again; the resource stays unregistered", "err", err)
		return
	}
	r.log.Info("The kubelet ended the device list stream of a registered plugin; registering again through the plugin watcher", "socket", r.socket())
	r.metrics.reregistration(r.name, reasonStreamEnded)
	r.stopRetired()
}

func (r *resource) setRegistered(ok bool, err error) {
	r.mu.Lock()
	r.registered = ok
	r.lastErr = err
	r.mu.Unlock()
	r.registrationChanged()
}

// setRegisteredFrom records the plugin watcher's verdict on the socket of
// the listen-th listen; a verdict on a socket this resource no longer
// serves is ignored.
func (r *resource) setRegisteredFrom(listen int, ok bool, err error) bool {
	r.mu.Lock()
	if listen != r.listens {
		r.mu.Unlock()
		return false
	}
	r.registered = ok
	r.lastErr = err
	r.mu.Unlock()
	r.registrationChanged()
	return true
}

// registrationChanged publishes the registration state: metrics and the
// server's readiness waiters. Call it without r.mu held.
func (r *resource) registrationChanged() {
	r.mu.Lock()
	ok := r.registered
	cb := r.onRegister
	r.mu.Unlock()
	r.metrics.setRegistered(r.name, ok)
	if cb != nil {
		cb()
	}
}

func (r *resource) isRegistered() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registered
}

// needsRegistration decides, when a trigger arrives, whether registering
// again is really needed. It keeps one kubelet restart from causing
// several registrations.
func (r *resource) needsRegistration(reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch reason {
	case reasonStreamEnded:
		if r.mode == RegistrationInProcess {
			// One stream per registration, opened after it: its end is
			// the kubelet dropping this plugin, never an old connection's.
			return r.streams == 0
		}
		// A stream that ends right after a registration belongs to the
		// kubelet's previous connection; acting on it could start a
		// registration storm. A real restart also re-creates kubelet.sock.
		return r.streams == 0 && r.cfg.Clock.Since(r.registeredAt) > r.cfg.StreamEndedGuard
	case reasonKubeletSocket:
		fi, err := os.Stat(r.cfg.KubeletSocket)
		if err != nil {
			return false // gone again; the next creation triggers us
		}
		// Inode numbers are reused at once when a socket is re-created, so
		// the modification time must match too.
		same := r.kubeletSock != nil && os.SameFile(fi, r.kubeletSock) && fi.ModTime().Equal(r.kubeletSock.ModTime())
		return !r.registered || !same
	case reasonRetry:
		return !r.registered
	case reasonSocketRemoved:
		// The socket served again after the removal may already be
		// registered: the loop, woken for another reason (the kubelet's
		// stream ended), registered it before taking this one. Registering
		// it again would be refused as "already connected".
		return !r.registered || r.registeredListen != r.listens || !r.ownsSocketLocked()
	default:
		return true
	}
}

// pushDevices is ListAndWatch for an in-process caller, on no goroutine
// of its own: send gets the current list at once, then each new one on
// the goroutine that made it (the plugin's Scan, a health change), in
// order; a list over the kubelet's 4 MiB limit, or send's error, ends the
// stream as gRPC's would (ResourceExhausted, send's error as a status),
// and the server's stop ends it with io.EOF: ended is told either. stop
// ends it from the caller's side (ended is not told), as a kubelet that
// cancels its stream. The first list does not wait for the first scan as
// a stream's does: an in-process plugin registers, and is watched, once
// it has waited for it.
func (r *resource) pushDevices(send func(*pluginapi.ListAndWatchResponse) error, ended func(error)) (stop func()) {
	w := &pushWatcher{r: r, send: send, ended: ended, sent: ^uint64(0)}
	r.streamOpened()
	// Checked under the lock endPushed lists the watchers with, after
	// the server closed stopping: a watcher is either ended there or
	// never registered.
	r.devices.mu.Lock()
	select {
	case <-r.stopping:
		r.devices.mu.Unlock()
		w.finish(streamEndedByServer, io.EOF)
		return func() {}
	default:
	}
	r.devices.pushed[w] = struct{}{}
	r.devices.mu.Unlock()
	w.push()
	return func() { w.finish(streamEndedByKubelet, nil) }
}

// awaitFirstScan waits for the plugin's first device list, until
// FirstScanWait after the first wait began: what the kubelet first sees
// of the resource, at its registration or on the first ListAndWatch of a
// plugin watcher that found the socket, is the plugin's devices, not an
// empty list it would refuse pods for. It reports false when ctx ended or
// the server stops first.
func (r *resource) awaitFirstScan(ctx context.Context, what string) bool {
	select {
	case <-r.scanned:
		return true
	default:
	}
	r.mu.Lock()
	if r.firstScanBy.IsZero() {
		r.firstScanBy = r.cfg.Clock.Now().Add(r.cfg.FirstScanWait)
	}
	left := r.firstScanBy.Sub(r.cfg.Clock.Now())
	r.mu.Unlock()
	if left <= 0 {
		return true // waited once already: go on with what there is
	}
	t := r.cfg.Clock.NewTimer(left)
	defer t.Stop()
	select {
	case <-r.scanned:
	case <-t.C():
		r.log.Warn("Plugin reported no devices in time; going on with none", "step", what, "firstScanWait", r.cfg.FirstScanWait)
	case <-ctx.Done():
		return false
	case <-r.stopping:
		return false
	}
	return true
}

// registerLoop registers the resource for every reason asked of it
// (requestRegistration), retrying with jittered back-off until it
// succeeds; a new reason during a back-off retries at once. It runs, on
// a goroutine of its own, only while reasons are pending (r.registration):
// a registered plugin, which a kubelet rarely asks to register again,
// holds none.
func (r *resource) registerLoop(ctx context.Context) {
	// Serve the first full device list: wait briefly for the first scan.
	if !r.awaitFirstScan(ctx, "registering") {
		return
	}
	b := backoff.Retry{Exponential: backoff.Exponential{Initial: r.cfg.RetryMin, Max: r.cfg.RetryMax}, Jitter: true}
	for ctx.Err() == nil && !r.registration.Idle(r.hasPending) {
		select {
		case <-r.trigger: // taken with the reasons it woke for
		default:
		}
		reasons := r.takeReasons()
		if len(reasons) == 0 {
			continue
		}
		// A registration is a re-registration when anything but the
		// start or a retry asked for it, whatever came first.
		for _, reason := range reasons {
			if reason != reasonStart && reason != reasonRetry {
				r.metrics.reregistration(r.name, reason)
				r.log.Info("Registering again", "reason", reason)
				break
			}
		}
		r.setRegistered(false, nil)
		b.Reset()
		for {
			err := r.registerOnce(ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				break
			}
			wait := b.Next()
			r.mu.Lock()
			repeated := r.lastErr != nil && r.lastErr.Error() == err.Error()
			r.lastErr = err
			r.mu.Unlock()
			// Say it once; the same failure again (the kubelet is still
			// down, say) is only worth a debug line.
			level := slog.LevelWarn
			if repeated {
				level = slog.LevelDebug
			}
			r.log.Log(ctx, level, "Registration failed; retrying until it succeeds", "err", err, "retryIn", wait.Round(time.Millisecond))
			t := r.cfg.Clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			case <-r.trigger:
				// Something changed (the kubelet socket appeared, say):
				// try again at once.
				r.takeReasons()
				b.Reset()
			}
			t.Stop()
		}
	}
}

// registerOnce makes one registration attempt through kubelet.sock
// (kubelet mode; in registry mode the plugin watcher finds the socket).
func (r *resource) registerOnce(ctx context.Context) error {
	if r.mode == RegistrationInProcess {
		return r.registerInProcess(ctx)
	}
	if _, err := r.relisten(); err != nil {
		return err
	}
	// Confirm the kubelet accepts connections before asking anything.
	fi, err := os.Stat(r.cfg.KubeletSocket)
	if err != nil {
		return fmt.Errorf("kubelet socket: %w", err)
	}
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "unix", r.cfg.KubeletSocket)
	if err != nil {
		return fmt.Errorf("kubelet socket does not accept connections: %w", err)
	}
	_ = conn.Close()

	cc, err := grpc.NewClient("unix://"+r.cfg.KubeletSocket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithAuthority("localhost"))
	if err != nil {
		return fmt.Errorf("kubelet client: %w", err)
	}
	defer cc.Close()
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RegisterTimeout)
	defer cancel()
	r.mu.Lock()
	endpoint, listen := filepath.Base(r.socketPath), r.listens
	r.mu.Unlock()
	_, err = pluginapi.NewRegistrationClient(cc).Register(rctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     endpoint,
		ResourceName: r.name,
		Options:      r.options(),
	})
	r.metrics.registration(r.name, err)
	if err != nil {
		return fmt.Errorf("register with the kubelet: %w", err)
	}
	r.mu.Lock()
	r.kubeletSock = fi
	r.registeredAt = r.cfg.Clock.Now()
	r.registeredListen = listen
	r.mu.Unlock()
	r.log.Info("Registered with the kubelet", "endpoint", endpoint)
	r.setRegistered(true, nil)
	// The kubelet now uses the new endpoint; end the old connections.
	r.stopRetired()
	return nil
}

// registerInProcess makes one registration attempt with the kubelet in
// this process (Config.InProcess), handing it the plugin's service.
func (r *resource) registerInProcess(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RegisterTimeout)
	defer cancel()
	name := socketBase(r.name) + "-" + r.cfg.InstanceID
	err := r.cfg.InProcess.ConnectInProcess(rctx, r.name, name, InProcessClient(service{r: r}))
	r.metrics.registration(r.name, err)
	if err != nil {
		return fmt.Errorf("register with the kubelet in this process: %w", err)
	}
	r.mu.Lock()
	r.registeredAt = r.cfg.Clock.Now()
	r.mu.Unlock()
	r.log.Info("Registered with the kubelet in this process", "endpoint", name)
	r.setRegistered(true, nil)
	return nil
}

// sleep waits d on the configured clock, or until ctx ends (false).
func (r *resource) sleep(ctx context.Context, d time.Duration) bool {
	t := r.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
		return true
	}
}
