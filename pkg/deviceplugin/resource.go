package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
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
	name       string
	plugin     Plugin
	preferred  PreferredAllocator
	prestart   PreStarter
	cfg        Config
	mode       RegistrationMode
	socketPath string
	log        *slog.Logger
	metrics    *metrics
	devices    *deviceSet

	grpc     *grpc.Server
	stopping chan struct{} // closed when the server shuts down
	trigger  chan struct{} // wakes the registration loop; reasons are in pending
	scanned  chan struct{} // closed on the first snapshot
	scanOnce sync.Once

	mu         sync.Mutex
	pending    map[string]bool // reasons to register that the loop has not seen
	ln         net.Listener
	socketInfo os.FileInfo // the socket file this instance created
	registered bool
	// kubeletSock is the kubelet.sock the last successful registration went
	// to, so a creation event for that same socket is not a restart.
	kubeletSock os.FileInfo
	streams     int
	everReg     bool
	// registeredAt is when the last registration succeeded.
	registeredAt time.Time
	lastErr      error
	onRegister   func() // called after every registration state change
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
	r.socketPath = filepath.Join(dir, socketBase(res.Name)+"-"+cfg.InstanceID+".sock")
	r.devices = newDeviceSet(r.snapshotChanged)
	r.grpc = grpc.NewServer(grpc.MaxRecvMsgSize(serverMaxRecvMsgSize))
	pluginapi.RegisterDevicePluginServer(r.grpc, service{r: r})
	if mode == RegistrationRegistry {
		registerapi.RegisterRegistrationServer(r.grpc, registrationService{r: r})
	}
	return r
}

func (r *resource) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{
		PreStartRequired:                r.prestart != nil,
		GetPreferredAllocationAvailable: r.preferred != nil,
	}
}

// notify is handed to Plugin.Scan.
func (r *resource) notify(devs []Device) {
	r.devices.update(devs)
	r.scanOnce.Do(func() { close(r.scanned) })
}

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
	b := backoff{min: r.cfg.RetryMin, max: r.cfg.RetryMax}
	for {
		err := r.plugin.Scan(ctx, r.notify)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			r.log.Debug("Scan finished; the device set is final")
			return
		}
		wait := b.next()
		r.log.Error("Scan failed; retrying", "error", err, "retryIn", wait)
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// listen (re)creates the resource's socket and serves on it. The previous
// listener, if any, is closed without unlinking: its path may already be
// somebody else's file.
func (r *resource) listen() error {
	if err := os.MkdirAll(filepath.Dir(r.socketPath), 0o755); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	if err := os.Remove(r.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", r.socketPath)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", r.socketPath, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	fi, err := os.Stat(r.socketPath)
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("stat %s: %w", r.socketPath, err)
	}
	r.ln, r.socketInfo = ln, fi
	go func() { _ = r.grpc.Serve(ln) }()
	r.log.Debug("Serving", "socket", r.socketPath)
	return nil
}

// ownsSocket reports whether the socket file on disk is the one this
// instance created.
func (r *resource) ownsSocket() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
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
	done := make(chan struct{})
	go func() { r.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(r.cfg.ShutdownTimeout):
		r.log.Warn("In-flight calls did not finish in time; closing them", "timeout", r.cfg.ShutdownTimeout)
		r.grpc.Stop()
		<-done
	}
	owned := r.ownsSocket()
	r.mu.Lock()
	if r.ln != nil {
		_ = r.ln.Close()
		r.ln = nil
	}
	r.mu.Unlock()
	if owned {
		if err := os.Remove(r.socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("Could not remove socket", "socket", r.socketPath, "error", err)
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
	select {
	case r.trigger <- struct{}{}:
	default: // the loop is already woken and will take every pending reason
	}
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
	if end == streamEndedByKubelet && last && r.mode == RegistrationKubelet {
		r.requestRegistration(reasonStreamEnded)
	}
}

func (r *resource) setRegistered(ok bool, err error) {
	r.mu.Lock()
	r.registered = ok
	r.lastErr = err
	if ok {
		r.everReg = true
	}
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
		// A stream that ends right after a registration belongs to the
		// kubelet's previous connection; acting on it could start a
		// registration storm. A real restart also re-creates kubelet.sock.
		return r.streams == 0 && time.Since(r.registeredAt) > time.Second
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
	default:
		return true
	}
}

// registerLoop registers the resource each time a trigger asks for it,
// retrying forever with jittered back-off until it succeeds. A new trigger
// during a back-off retries at once.
func (r *resource) registerLoop(ctx context.Context) {
	// Serve the first full device list: wait briefly for the first scan.
	select {
	case <-r.scanned:
	case <-time.After(5 * time.Second):
		r.log.Warn("Plugin reported no devices within 5s of start; registering with none")
	case <-ctx.Done():
		return
	}
	b := backoff{min: r.cfg.RetryMin, max: r.cfg.RetryMax}
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		}
		reasons := r.takeReasons()
		if len(reasons) == 0 {
			continue
		}
		if reason := reasons[0]; reason != reasonStart && reason != reasonRetry {
			r.metrics.reregistration(r.name, reason)
			r.log.Info("Registering again", "reason", reason)
		}
		r.setRegistered(false, nil)
		b.reset()
		for {
			err := r.registerOnce(ctx)
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				break
			}
			wait := b.next()
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
			r.log.Log(ctx, level, "Registration failed; retrying until it succeeds", "error", err, "retryIn", wait.Round(time.Millisecond))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			case <-r.trigger:
				// Something changed (the kubelet socket appeared, say):
				// try again at once.
				r.takeReasons()
				b.reset()
			}
		}
	}
}

// registerOnce makes one registration attempt. In registry mode the
// kubelet's plugin watcher finds the socket by itself, so serving it is all
// there is to do.
func (r *resource) registerOnce(ctx context.Context) error {
	if !r.ownsSocket() {
		if err := r.listen(); err != nil {
			return err
		}
	}
	if r.mode == RegistrationRegistry {
		return nil
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
	_, err = pluginapi.NewRegistrationClient(cc).Register(rctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(r.socketPath),
		ResourceName: r.name,
		Options:      r.options(),
	})
	r.metrics.registration(r.name, err)
	if err != nil {
		return fmt.Errorf("register with the kubelet: %w", err)
	}
	r.mu.Lock()
	r.kubeletSock = fi
	r.registeredAt = time.Now()
	r.mu.Unlock()
	r.log.Info("Registered with the kubelet", "endpoint", filepath.Base(r.socketPath))
	r.setRegistered(true, nil)
	return nil
}

// backoff is a jittered exponential back-off.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) reset() { b.cur = 0 }

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	// Full jitter in [cur/2, cur).
	half := b.cur / 2
	return half + time.Duration(rand.Int64N(int64(half)+1))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
