package draverify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/internal/verifyproc"
	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/verify"
)

// The driver's registration through the plugin watcher and the checks of
// it: dra.registration, and registering again after a kubelet restart
// (dra.registration.kubelet-restart) or the driver's own
// (dra.registration.driver-restart).

// registration is one answer of the kubelet side to the driver's
// registration socket: accepted (err nil) or refused.
type registration struct {
	name, endpoint string
	versions       []string
	err            error
	at             time.Time
}

// recorder passes the plugin watcher's calls on to the DRA manager and
// records each outcome.
type recorder struct {
	next pluginwatcher.Handler
	ch   chan<- registration
}

func (h recorder) send(reg registration) {
	select {
	case h.ch <- reg:
	default:
	}
}

func (h recorder) ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error {
	err := h.next.ValidatePlugin(ctx, name, endpoint, versions)
	if err != nil {
		h.send(registration{name, endpoint, versions, err, time.Now()})
	}
	return err
}

func (h recorder) RegisterPlugin(ctx context.Context, name, endpoint string, versions []string) error {
	err := h.next.RegisterPlugin(ctx, name, endpoint, versions)
	h.send(registration{name, endpoint, versions, err, time.Now()})
	return err
}

func (h recorder) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	h.next.DeRegisterPlugin(ctx, name, endpoint)
}

// watcherBackoff is how long verify's plugin watcher waits before it dials
// a registration socket again after a failure (a restarted driver's socket
// that does not answer yet, a stale one). Not the kubelet's growing
// back-off: that could put up to a second of the watcher's own between a
// driver's registration and its judging, and turn a prompt
// re-registration into a WARN in one run of ten
// (hack/verify-dra-stability.sh).
const watcherBackoff = 100 * time.Millisecond

// startKubelet starts the kubelet side: a DRA manager on the state
// directory (its checkpoint survives restarts) and a plugin watcher on
// plugins_registry.
func (r *run) startKubelet() error {
	log := kubeletLogger(r.log)
	mgr, err := dramanager.New(dramanager.Config{Root: r.stateDir, Logger: log, CallTimeout: r.cfg.PrepareTimeout, HealthTimeout: r.cfg.HealthTimeout})
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := mgr.Start(ctx); err != nil {
		cancel()
		return fmt.Errorf("DRA manager: %w", err)
	}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      r.registryDir,
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DRAPlugin: recorder{next: mgr.PluginHandler(), ch: r.regs}},
		Logger:   log,
		// The kubelet reconciles every second; verify does so at once,
		// so that a registration's time is the driver's, not the
		// watcher's.
		ReconcilePeriod: 50 * time.Millisecond,
		InitialBackoff:  watcherBackoff,
		MaxBackoff:      watcherBackoff,
	})
	if err != nil {
		cancel()
		mgr.Stop()
		return fmt.Errorf("plugin watcher: %w", err)
	}
	if err := w.Start(ctx); err != nil {
		cancel()
		mgr.Stop()
		return fmt.Errorf("plugin watcher: %w", err)
	}
	r.mgr, r.pw, r.pwCancel = mgr, w, cancel
	return nil
}

func (r *run) stopKubelet() {
	if r.pwCancel != nil {
		r.pwCancel()
		<-r.pw.Done()
		r.mgr.Stop()
		r.pwCancel = nil
	}
}

// reconnect takes reg's endpoint as the driver's and dials it; on error
// the run stops.
func (r *run) reconnect(reg registration) bool {
	r.endpoint = reg.endpoint
	if err := r.connect(reg); err != nil {
		return r.stop(err.Error())
	}
	return true
}

// waitRegistration waits up to d for the kubelet side to accept a
// registration; it returns the last refusal when none was accepted.
func (r *run) waitRegistration(ctx context.Context, d time.Duration) (registration, bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	var last registration
	for {
		select {
		case reg := <-r.regs:
			if reg.err == nil {
				return reg, true
			}
			last = reg
		case <-t.C:
			return last, false
		case <-r.proc.Done():
			return last, false
		case <-ctx.Done():
			return last, false
		}
	}
}

func (r *run) drainRegistrations() {
	for {
		select {
		case <-r.regs:
		default:
			return
		}
	}
}

var serviceName = regexp.MustCompile(`^v[0-9]+((alpha|beta)[0-9]+)?\.[A-Z][A-Za-z0-9]*$`)

func (r *run) checkRegistration(ctx context.Context) bool {
	start := time.Now()
	reg, ok := r.waitRegistration(ctx, r.cfg.RegisterTimeout)
	if !ok {
		if ctx.Err() != nil {
			return false
		}
		var why string
		switch {
		case r.proc.Exit() != "":
			why = "the driver " + r.proc.Exit() + " before registering"
			r.exitJudged = true
		case reg.err != nil:
			why = fmt.Sprintf("the kubelet refused driver %q at %s (versions %q): %v", reg.name, reg.endpoint, reg.versions, reg.err)
		default:
			why = fmt.Sprintf("no registration within %s; %s", r.cfg.RegisterTimeout, r.registryState())
		}
		r.set(verify.CheckDRARegistration, verify.Fail, "%s", why)
		return r.stop("see " + verify.CheckDRARegistration)
	}
	r.driver, r.endpoint = reg.name, reg.endpoint
	problems := registrationProblems(reg, r.pluginsDir)
	err := r.connect(reg)
	switch {
	case len(problems) > 0:
		r.set(verify.CheckDRARegistration, verify.Fail, "%s", strings.Join(problems, "; "))
	case err == nil:
		r.set(verify.CheckDRARegistration, verify.Pass, "driver %s, endpoint %s, services %s (called in %s), registered %s after start",
			reg.name, reg.endpoint, strings.Join(reg.versions, ","), r.negotiated(), reg.at.Sub(start).Round(time.Millisecond))
	}
	if err != nil {
		return r.stop(err.Error())
	}
	return true
}

// registrationProblems lists what is wrong with an accepted registration:
// what the kubelet refuses (a driver name that is no DNS subdomain of at
// most 63 characters, a version that is no gRPC service name) and an
// endpoint outside pluginsDir, where the kubelet's plugins live.
func registrationProblems(reg registration, pluginsDir string) []string {
	var problems []string
	if len(reg.name) > 63 || len(validation.IsDNS1123Subdomain(reg.name)) > 0 {
		problems = append(problems, fmt.Sprintf("driver name %q is not a DNS subdomain of at most 63 characters", reg.name))
	}
	for _, v := range reg.versions {
		if !serviceName.MatchString(v) {
			problems = append(problems, fmt.Sprintf("version %q is not a gRPC service name such as %s", v, drav1.DRAPluginService))
		}
	}
	if rel, err := filepath.Rel(pluginsDir, reg.endpoint); err != nil || strings.HasPrefix(rel, "..") {
		problems = append(problems, fmt.Sprintf("endpoint %s is not under the plugins directory %s ($%s)", reg.endpoint, pluginsDir, verifyproc.EnvDRAPluginsDir))
	}
	return problems
}

// negotiated names the services the run calls the driver in.
func (r *run) negotiated() string {
	if r.plugin.HealthService() == "" {
		return r.plugin.Service()
	}
	return r.plugin.Service() + " and " + r.plugin.HealthService()
}

// connect dials the endpoint of an accepted registration and calls it in
// the services the kubelet negotiates from its versions.
func (r *run) connect(reg registration) error {
	svc, health, err := dramanager.Negotiate(reg.versions)
	if err != nil {
		return fmt.Errorf("no service to call driver %s in: %w", reg.name, err)
	}
	conn, err := grpc.NewClient("unix:"+reg.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("cannot connect to %s: %w", reg.endpoint, err)
	}
	if r.conn != nil {
		_ = r.conn.Close()
	}
	r.conn, r.plugin = conn, dramanager.NewClient(conn, svc, health)
	return nil
}

// registryState says what verify found in plugins_registry.
func (r *run) registryState() string {
	var socks []string
	_ = filepath.WalkDir(r.registryDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type()&os.ModeSocket != 0 {
			socks = append(socks, filepath.Base(p))
		}
		return nil
	})
	var fails []string
	for _, f := range r.pw.Failures() {
		fails = append(fails, filepath.Base(f.SocketPath)+": "+f.LastError)
	}
	switch {
	case len(fails) > 0:
		return "the plugin watcher could not register " + strings.Join(fails, "; ")
	case len(socks) > 0:
		return "plugins_registry has " + strings.Join(socks, ", ") + " but none answered GetInfo with type DRAPlugin"
	}
	return fmt.Sprintf("no socket in plugins_registry (%s); the driver must take the directory from $%s or {registry-dir}", r.registryDir, verifyproc.EnvRegistryDir)
}

// errKilled is returned by signalWait when the process had to be killed.
var errKilled = errors.New("killed")

// signalWait sends sig and waits up to d for the driver to exit; it kills
// it after that.
func (r *run) signalWait(sig syscall.Signal, d time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = r.proc.Signal(sig)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.proc.Done():
		return time.Since(start), nil
	case <-t.C:
		r.proc.Kill()
		return d, errKilled
	}
}

// sockets lists the sockets under the registry and plugins directories.
func (r *run) sockets() []string {
	var out []string
	for _, dir := range []string{r.registryDir, r.pluginsDir} {
		_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.Type()&os.ModeSocket != 0 {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// rel names paths relative to the temporary root.
func (r *run) rel(paths []string) string {
	out := make([]string, len(paths))
	for i, p := range paths {
		if rp, err := filepath.Rel(r.root, p); err == nil {
			p = rp
		}
		out[i] = p
	}
	return strings.Join(out, ", ")
}

func (r *run) judgeRestart(id string, took time.Duration, ok bool, what string) {
	switch {
	case !ok:
		r.set(id, verify.Fail, "not registered again within %s after %s", r.cfg.ReregisterThreshold, what)
	case took > r.cfg.ReregisterWarn:
		// A time, however slow: a warning with it. Only no registration
		// at all within the threshold fails.
		r.set(id, verify.Warn, "registered again %s after %s (over %s)", took.Round(time.Millisecond), what, r.cfg.ReregisterWarn)
	default:
		r.set(id, verify.Pass, "registered again %s after %s", took.Round(time.Millisecond), what)
	}
}

func (r *run) checkKubeletRestart(ctx context.Context) bool {
	r.stopKubelet()
	r.drainRegistrations()
	start := time.Now()
	if err := r.startKubelet(); err != nil {
		r.set(verify.CheckDRAKubeletRestart, verify.Skip, "the kubelet side did not start again: %v", err)
		return true
	}
	reg, ok := r.waitRegistration(ctx, r.cfg.ReregisterThreshold)
	r.judgeRestart(verify.CheckDRAKubeletRestart, reg.at.Sub(start), ok, "the kubelet restarted")
	return true
}

func (r *run) checkDriverRestart(ctx context.Context) bool {
	// A crash: no chance to clean up. Then a reboot: the CDI directory,
	// a tmpfs, is empty; the checkpoints survive.
	_, _ = r.signalWait(syscall.SIGKILL, r.cfg.TermTimeout)
	stale := r.sockets()
	if err := os.RemoveAll(r.cdiDir); err == nil {
		_ = os.MkdirAll(r.cdiDir, 0o750)
	}
	r.drainRegistrations()
	start := time.Now()
	proc, err := verifyproc.Start(r.command, r.env)
	if err != nil {
		r.set(verify.CheckDRADriverRestart, verify.Fail, "could not start the driver again: %v", err)
		return r.stop("see " + verify.CheckDRADriverRestart)
	}
	r.proc = proc
	reg, ok := r.waitRegistration(ctx, r.cfg.ReregisterThreshold)
	what := "the driver was killed and started again"
	if len(stale) > 0 {
		what += " with stale sockets (" + r.rel(stale) + ")"
	}
	if !ok && r.proc.Exit() != "" {
		r.set(verify.CheckDRADriverRestart, verify.Fail, "the driver %s after it was started again%s", r.proc.Exit(), strings.TrimPrefix(what, "the driver was killed and started again"))
		r.exitJudged = true
		return r.stop("see " + verify.CheckDRADriverRestart)
	}
	r.judgeRestart(verify.CheckDRADriverRestart, reg.at.Sub(start), ok, what)
	if !ok {
		return r.stop("see " + verify.CheckDRADriverRestart)
	}
	if !r.reconnect(reg) {
		return false
	}
	// The slices: the same devices, once the driver is done publishing
	// (the old ones are still there). Whether the generation went the
	// right way is dra.slices.generation's to judge, from every version
	// of the slices.
	r.settle(ctx, reg.at)
	wait := 2 * r.cfg.CallTimeout
	node := r.nodeObject(ctx)
	sl, err := r.waitSlices(ctx, wait, func(sl []resourcev1.ResourceSlice) bool {
		return complete(sl) && slices.Equal(deviceNames(sl, r.pool, node), r.published)
	})
	switch now := deviceNames(sl, r.pool, node); {
	case err != nil:
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "listing the ResourceSlices: %v", err)
	case !complete(sl):
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "no complete pool %s for node %s within %s after the restart", r.pool, r.node, wait)
	case !slices.Equal(now, r.published):
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "pool %s lists %q after the restart, %q before", r.pool, now, r.published)
	default:
		r.set(verify.CheckDRASlicesRestart, verify.Pass, "pool %s: %d device(s), generation %d (was %d)", r.pool, len(r.published), newestGeneration(sl, r.pool), r.generation)
	}
	r.checkReboot(ctx)
	return true
}
