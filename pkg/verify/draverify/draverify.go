// Package draverify checks that a DRA driver behaves the way the kubelet
// needs it to (dpkit verify --dra). It runs the driver as a process with a
// temporary kubelet root, hosts the kubelet side with pkg/dramanager and
// the plugin watcher, writes ResourceClaims with their allocations on an
// API server (no scheduler needed), and drives the driver through
// registration, ResourceSlices, Prepare and Unprepare, CDI specs, a kubelet
// restart, its own restart after a simulated reboot, health and SIGTERM.
// It reports one verdict per check of verify.DRAChecks.
//
// It is a package of its own because it needs client-go, which the dpkit
// binary does not link: dpkit hands verify --dra to dpkit-cluster.
package draverify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/verify"
)

// Run verifies the DRA driver cfg describes. The error is non-nil only
// when the run could not be set up (no API server, the command could not
// start); a misbehaving driver gives a Report with failed checks. When ctx
// ends first, Run stops the driver and returns a Report that is
// Interrupted.
func Run(ctx context.Context, cfg verify.DRAConfig) (*verify.Report, error) {
	if err := cfg.Problems().ToAggregate(); err != nil {
		return nil, fmt.Errorf("invalid verify configuration: %w", err)
	}
	cfg = cfg.WithDefaults()
	start := time.Now()
	r := &run{cfg: cfg, log: cfg.Logger, results: map[string]*verify.Result{}, reported: map[string]bool{}, regs: make(chan registration, 64)}
	for _, c := range verify.DRAChecks() {
		r.results[c.ID] = &verify.Result{}
	}
	if err := r.setup(ctx); err != nil {
		r.cleanup()
		return nil, err
	}
	r.steps(ctx)
	r.cleanup()

	rep := &verify.Report{Command: r.command, Mode: verify.DRAMode, PluginDir: r.pluginsDir, Interrupted: ctx.Err() != nil}
	if r.driver != "" {
		rep.Resources = []string{r.driver}
	}
	notReached := "not reached"
	switch {
	case rep.Interrupted:
		notReached = "interrupted"
	case r.stopped != "":
		notReached = r.stopped
	}
	for _, res := range r.results {
		if res.Verdict == "" {
			res.Verdict, res.Detail = verify.Skip, notReached
		}
	}
	r.report()
	for _, c := range verify.DRAChecks() {
		rep.Results = append(rep.Results, c.FinalResult(*r.results[c.ID]))
	}
	rep.Summary = verify.Summarize(rep.Results)
	if rep.Failed() && r.proc != nil {
		rep.PluginOutput = r.proc.Output()
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

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

// run is one run's state.
type run struct {
	cfg      verify.DRAConfig
	log      *slog.Logger
	results  map[string]*verify.Result
	reported map[string]bool

	client kubernetes.Interface
	// nodeCreated, nsCreated and created say what the run wrote on the
	// API server (created: the claims' names), for cleanup.
	nodeCreated, nsCreated bool
	created                []string
	kubeconfig,
	root, registryDir, pluginsDir, cdiDir, stateDir string
	node, ns string
	podUID   types.UID
	command  []string
	env      []string
	proc     *verify.Process

	// The kubelet side: the DRA manager and the plugin watcher.
	mgr      *dramanager.Manager
	pw       *pluginwatcher.Watcher
	pwCancel context.CancelFunc
	regs     chan registration

	driver, endpoint string
	conn             *grpc.ClientConn
	pool             string
	devices          []string
	generation       int64
	prepared         map[string]*drav1.NodePrepareResourceResponse // claim UID -> answer
	claims           map[string]*resourcev1.ResourceClaim          // role -> claim
	slowest          time.Duration
	slowestCall      string
	health           *healthWatch
	slices           *sliceWatch

	// stopped is why the run stopped before every check was done.
	stopped string
	// exitJudged is set when a check's verdict already says that the
	// driver exited (before registering, or when started again), so
	// that the exit is not blamed on dra.shutdown.exit as well.
	exitJudged bool
}

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
		InitialBackoff:  100 * time.Millisecond,
		MaxBackoff:      time.Second,
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

// set records a check's verdict.
func (r *run) set(id string, v verify.Verdict, format string, args ...any) {
	res := r.results[id]
	res.Verdict, res.Detail = v, fmt.Sprintf(format, args...)
	r.log.Debug("Check done", "check", id, "verdict", v, "detail", res.Detail)
}

func (r *run) decided(id string) bool { return r.results[id].Verdict != "" }

// report hands the checks decided so far to Config.Progress.
func (r *run) report() {
	for _, c := range verify.DRAChecks() {
		if !r.decided(c.ID) || r.reported[c.ID] {
			continue
		}
		r.reported[c.ID] = true
		if r.cfg.Progress != nil {
			r.cfg.Progress(c.FinalResult(*r.results[c.ID]))
		}
	}
}

func (r *run) skipRest(reason string) {
	for _, c := range verify.DRAChecks() {
		if !r.decided(c.ID) {
			r.set(c.ID, verify.Skip, "%s", reason)
		}
	}
}

// steps runs the checks in order; each step returns false when the run
// cannot go on.
func (r *run) steps(ctx context.Context) {
	steps := []struct {
		name string
		fn   func(context.Context) bool
	}{
		{"registration", r.checkRegistration},
		{"the ResourceSlice checks", r.checkSlices},
		{"the Prepare checks", r.checkPrepare},
		{"the kubelet restart", r.checkKubeletRestart},
		{"the driver's restart", r.checkDriverRestart},
		{"the health checks", r.checkHealth},
		{"shutdown", r.checkShutdown},
	}
	for _, s := range steps {
		ok := s.fn(ctx)
		if ctx.Err() != nil {
			r.skipRest("interrupted")
			return
		}
		if s.name != "shutdown" && r.proc.Exit() != "" && !r.exitJudged {
			// One cause, one failure: the exit, not what it broke.
			r.results[verify.CheckDRAExit].Verdict = ""
			r.set(verify.CheckDRAExit, verify.Fail, "the driver %s on its own during %s", r.proc.Exit(), s.name)
			r.stopped = "see " + verify.CheckDRAExit
			for _, c := range verify.DRAChecks() {
				if res := r.results[c.ID]; c.ID != verify.CheckDRAExit && !r.reported[c.ID] && res.Verdict == verify.Fail {
					res.Verdict, res.Detail = "", ""
				}
			}
			r.skipRest(r.stopped)
			r.report()
			return
		}
		r.report()
		if !ok {
			return
		}
	}
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
		r.stopped = "see " + verify.CheckDRARegistration
		r.skipRest(r.stopped)
		return false
	}
	r.driver, r.endpoint = reg.name, reg.endpoint
	var problems []string
	if len(reg.name) > 63 || len(validation.IsDNS1123Subdomain(reg.name)) > 0 {
		problems = append(problems, fmt.Sprintf("driver name %q is not a DNS subdomain of at most 63 characters", reg.name))
	}
	for _, v := range reg.versions {
		if !serviceName.MatchString(v) {
			problems = append(problems, fmt.Sprintf("version %q is not a gRPC service name such as %s", v, drav1.DRAPluginService))
		}
	}
	if rel, err := filepath.Rel(r.pluginsDir, reg.endpoint); err != nil || strings.HasPrefix(rel, "..") {
		problems = append(problems, fmt.Sprintf("endpoint %s is not under the plugins directory %s ($%s)", reg.endpoint, r.pluginsDir, verify.EnvDRAPluginsDir))
	}
	if len(problems) > 0 {
		r.set(verify.CheckDRARegistration, verify.Fail, "%s", strings.Join(problems, "; "))
	} else {
		r.set(verify.CheckDRARegistration, verify.Pass, "driver %s, endpoint %s, services %s, registered %s after start",
			reg.name, reg.endpoint, strings.Join(reg.versions, ","), reg.at.Sub(start).Round(time.Millisecond))
	}
	conn, err := grpc.NewClient("unix:"+reg.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.stopped = fmt.Sprintf("cannot connect to %s: %v", reg.endpoint, err)
		r.skipRest(r.stopped)
		return false
	}
	r.conn = conn
	return true
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
	return fmt.Sprintf("no socket in plugins_registry (%s); the driver must take the directory from $%s or {registry-dir}", r.registryDir, verify.EnvRegistryDir)
}

// slicesNow lists the driver's ResourceSlices on the node.
func (r *run) slicesNow(ctx context.Context) ([]resourcev1.ResourceSlice, error) {
	l, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + r.node + "," + resourcev1.ResourceSliceSelectorDriver + "=" + r.driver})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// complete reports whether slices form complete pools of one generation.
func complete(sl []resourcev1.ResourceSlice) bool {
	if len(sl) == 0 {
		return false
	}
	type key struct {
		pool string
		gen  int64
	}
	count := map[key]int64{}
	want := map[key]int64{}
	newest := map[string]int64{}
	for _, s := range sl {
		k := key{s.Spec.Pool.Name, s.Spec.Pool.Generation}
		count[k]++
		want[k] = s.Spec.Pool.ResourceSliceCount
		newest[k.pool] = max(newest[k.pool], k.gen)
	}
	for pool, gen := range newest {
		k := key{pool, gen}
		if count[k] != want[k] {
			return false
		}
	}
	return true
}

// waitSlices waits up to d for complete pools of the driver's slices.
func (r *run) waitSlices(ctx context.Context, d time.Duration, ok func([]resourcev1.ResourceSlice) bool) ([]resourcev1.ResourceSlice, error) {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		sl, err := r.slicesNow(ctx)
		if err == nil && ok(sl) {
			return sl, nil
		}
		if time.Now().After(deadline) {
			return sl, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

func (r *run) checkSlices(ctx context.Context) bool {
	sl, err := r.waitSlices(ctx, 2*r.cfg.CallTimeout, complete)
	if err != nil {
		r.set(verify.CheckDRASlices, verify.Fail, "listing the ResourceSlices: %v", err)
		r.stopped = "no devices: see " + verify.CheckDRASlices
		r.skipRest(r.stopped)
		return false
	}
	if len(sl) == 0 {
		r.set(verify.CheckDRASlices, verify.Fail, "no ResourceSlice of driver %s with spec.nodeName %s within %s", r.driver, r.node, 2*r.cfg.CallTimeout)
		r.stopped = "no devices: see " + verify.CheckDRASlices
		r.skipRest(r.stopped)
		return false
	}
	var problems []string
	pools := map[string]bool{}
	for _, s := range sl {
		if n := len(s.Spec.Devices); n > 128 {
			problems = append(problems, fmt.Sprintf("%s has %d devices (at most 128)", s.Name, n))
		}
		owned := slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Node" && o.Name == r.node })
		if !owned {
			problems = append(problems, fmt.Sprintf("%s is not owned by Node %s (ownerReferences)", s.Name, r.node))
		}
		pools[s.Spec.Pool.Name] = true
	}
	if !complete(sl) {
		problems = append(problems, "the pool's slices disagree on generation or resourceSliceCount")
	}
	// The checks prepare devices of the first pool.
	sort.Slice(sl, func(i, j int) bool { return sl[i].Name < sl[j].Name })
	r.pool, r.generation = sl[0].Spec.Pool.Name, sl[0].Spec.Pool.Generation
	r.devices = deviceNames(sl, r.pool)
	if len(r.devices) == 0 {
		problems = append(problems, "no devices in pool "+r.pool)
	}
	if len(problems) > 0 {
		r.set(verify.CheckDRASlices, verify.Fail, "%s", strings.Join(problems, "; "))
	} else {
		r.set(verify.CheckDRASlices, verify.Pass, "%d slice(s), %d pool(s), %d device(s) in pool %s (generation %d)", len(sl), len(pools), len(r.devices), r.pool, r.generation)
	}
	if len(r.devices) == 0 {
		r.stopped = "no devices: see " + verify.CheckDRASlices
		r.skipRest(r.stopped)
		return false
	}
	return true
}

func deviceNames(sl []resourcev1.ResourceSlice, pool string) []string {
	var out []string
	gen := int64(-1)
	for _, s := range sl {
		if s.Spec.Pool.Name == pool {
			gen = max(gen, s.Spec.Pool.Generation)
		}
	}
	for _, s := range sl {
		if s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != gen {
			continue
		}
		for _, d := range s.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	sort.Strings(out)
	return out
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
	case took > r.cfg.ReregisterThreshold:
		r.set(id, verify.Fail, "registered again %s after %s (threshold %s)", took.Round(time.Millisecond), what, r.cfg.ReregisterThreshold)
	case took > r.cfg.ReregisterWarn:
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
	proc, err := verify.StartProcess(r.command, r.env)
	if err != nil {
		r.set(verify.CheckDRADriverRestart, verify.Fail, "could not start the driver again: %v", err)
		r.stopped = "see " + verify.CheckDRADriverRestart
		r.skipRest(r.stopped)
		return false
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
		r.stopped = "see " + verify.CheckDRADriverRestart
		r.skipRest(r.stopped)
		return false
	}
	r.judgeRestart(verify.CheckDRADriverRestart, reg.at.Sub(start), ok, what)
	if !ok {
		r.stopped = "see " + verify.CheckDRADriverRestart
		r.skipRest(r.stopped)
		return false
	}
	r.endpoint = reg.endpoint
	_ = r.conn.Close()
	r.conn, err = grpc.NewClient("unix:"+reg.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.skipRest(err.Error())
		return false
	}
	// The slices: the same devices, the generation not going back.
	sl, err := r.waitSlices(ctx, 2*r.cfg.CallTimeout, func(sl []resourcev1.ResourceSlice) bool {
		return complete(sl) && slices.Equal(deviceNames(sl, r.pool), r.devices)
	})
	switch {
	case err != nil:
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "listing the ResourceSlices: %v", err)
	case !complete(sl):
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "no complete pool %s within %s after the restart", r.pool, 2*r.cfg.CallTimeout)
	case !slices.Equal(deviceNames(sl, r.pool), r.devices):
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "pool %s lists %q after the restart, %q before", r.pool, deviceNames(sl, r.pool), r.devices)
	default:
		gen := int64(0)
		for _, s := range sl {
			if s.Spec.Pool.Name == r.pool {
				gen = max(gen, s.Spec.Pool.Generation)
			}
		}
		if gen < r.generation {
			r.set(verify.CheckDRASlicesRestart, verify.Fail, "pool %s went from generation %d to %d", r.pool, r.generation, gen)
		} else {
			r.set(verify.CheckDRASlicesRestart, verify.Pass, "pool %s: %d device(s), generation %d (was %d)", r.pool, len(r.devices), gen, r.generation)
		}
	}
	r.checkReboot(ctx)
	return true
}
