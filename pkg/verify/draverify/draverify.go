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
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/internal/verifyproc"
	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/verify"
)

// Run verifies the DRA driver cfg describes, against the API server of
// api: Run makes a Node, a Namespace and the driver's ServiceAccount
// there, and removes them. The error is non-nil only when the run could
// not be set up (no API server, the command could not start); a
// misbehaving driver gives a Report with failed checks. When ctx ends
// first, Run stops the driver and returns a Report that is Interrupted.
func Run(ctx context.Context, api *rest.Config, cfg verify.DRAConfig) (*verify.Report, error) {
	if err := cfg.Problems().ToAggregate(); err != nil {
		return nil, fmt.Errorf("invalid verify configuration: %w", err)
	}
	if api == nil {
		return nil, errors.New("invalid verify configuration: no API server client configuration given")
	}
	cfg = withDefaults(cfg)
	start := time.Now()
	r := &run{api: api, cfg: cfg, log: cfg.Logger, results: map[string]*verify.Result{}, reported: map[string]bool{}, regs: make(chan registration, 64)}
	for _, c := range verify.DRAChecks() {
		r.results[c.ID] = &verify.Result{}
	}
	if err := r.setup(ctx); err != nil {
		r.cleanup()
		return nil, err
	}
	r.steps(ctx)
	r.cleanup()

	rep := &verify.Report{Command: r.command, Mode: modeDRA, PluginDir: r.pluginsDir, Interrupted: ctx.Err() != nil}
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
		rep.Results = append(rep.Results, final(c, *r.results[c.ID]))
	}
	rep.Summary = verify.Summarize(rep.Results)
	if rep.Failed() && r.proc != nil {
		rep.PluginOutput = r.proc.Output()
	}
	rep.Duration = time.Since(start)
	return rep, nil
}

// modeDRA is Report.Mode of a DRA driver's run.
const modeDRA = "dra"

// withDefaults returns c with every zero field set to its default.
func withDefaults(c verify.DRAConfig) verify.DRAConfig {
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&c.RegisterTimeout, verify.DefaultDRARegisterTimeout)
	set(&c.ReregisterWarn, verify.DefaultDRAReregisterWarn)
	set(&c.ReregisterThreshold, verify.DefaultDRAReregisterThreshold)
	set(&c.PrepareTimeout, verify.DefaultPrepareTimeout)
	set(&c.HealthTimeout, verify.DefaultDRAHealthTimeout)
	set(&c.TermTimeout, verify.DefaultTermTimeout)
	set(&c.CallTimeout, verify.DefaultCallTimeout)
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// final is res as the report gives it: with the check's texts, and its
// fix and the link to its section when it failed or warned.
func final(c verify.CheckInfo, res verify.Result) verify.Result {
	res.ID, res.Description, res.Basis = c.ID, c.Description, c.Basis
	if res.Verdict == verify.Fail || res.Verdict == verify.Warn {
		res.Fix, res.Docs = c.Fix, c.DocsURL()
	}
	return res
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
	api      *rest.Config // the API server's, as given
	cfg      verify.DRAConfig
	log      *slog.Logger
	results  map[string]*verify.Result
	reported map[string]bool

	client kubernetes.Interface
	// created: the claims' names. sb: what verify sets up around the
	// driver, what tells the run's objects from others' (access.go).
	created []string
	sb      *sandbox
	kubeconfig,
	root, registryDir, pluginsDir, cdiDir, stateDir string
	node, ns string
	podUID   types.UID
	command  []string
	env      []string
	proc     *verifyproc.Process

	// driverPod is the UID of the pod the running instance of the driver
	// is in ($POD_UID, {pod-uid}).
	driverPod types.UID

	// The kubelet side: the DRA manager and the plugin watcher.
	mgr      *dramanager.Manager
	pw       *pluginwatcher.Watcher
	pwCancel context.CancelFunc
	regs     chan registration

	driver, endpoint string
	conn             *grpc.ClientConn
	// plugin calls the driver in the services negotiated at its
	// registration (v1 or v1beta1 DRAPlugin, v1 or v1alpha1 health), as
	// the kubelet does.
	plugin dramanager.Client
	// nodeObj is the run's Node as the API server has it, for matching
	// the ResourceSlices' node selectors.
	nodeObj     *corev1.Node
	pool        string
	devices     []string
	generation  int64
	prepared    map[string]*drav1.NodePrepareResourceResponse // claim UID -> answer
	claims      map[string]*resourcev1.ResourceClaim          // role -> claim
	slowest     time.Duration
	slowestCall string
	health      *healthWatch
	slices      *sliceWatch

	// stopped is why the run stopped before every check was done.
	stopped string
	// exitJudged is set when a check's verdict already says that the
	// driver exited (before registering, or when started again), so
	// that the exit is not blamed on dra.shutdown.exit as well.
	exitJudged bool

	// lastHealth is what the health checks' stream saw, for
	// dra.health.published-devices (healthdevices.go).
	lastHealth *healthWatch
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

// set records a check's verdict.
func (r *run) set(id string, v verify.Verdict, format string, args ...any) {
	res := r.results[id]
	res.Verdict, res.Detail = v, fmt.Sprintf(format, args...)
	r.oneCause(id, res)
	r.log.Debug("Check done", "check", id, "verdict", res.Verdict, "detail", res.Detail)
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
			r.cfg.Progress(final(c, *r.results[c.ID]))
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

// stop records why the run cannot go on, skips the checks not decided
// yet with that reason, and returns false (a step's "stop here").
func (r *run) stop(reason string) bool {
	r.stopped = reason
	r.skipRest(reason)
	return false
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
		{"what the driver publishes and prepares", r.checkContent},
		{"the kubelet restart", r.checkKubeletRestart},
		{"the driver's restart", r.checkDriverRestart},
		{"the batched and concurrent calls", r.checkCalls},
		{"the claims' lifecycle", r.checkLifecycle},
		{"the rolling update", r.checkRollingUpdate},
		{"the version skew", r.checkVersionSkew},
		{"the health checks", r.checkHealth},
		{"the devices of the health reports", r.checkHealthDevices},
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
		return r.stop("see " + verify.CheckDRARegistration)
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
		problems = append(problems, fmt.Sprintf("endpoint %s is not under the plugins directory %s ($%s)", reg.endpoint, r.pluginsDir, verifyproc.EnvDRAPluginsDir))
	}
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

// slicesNow lists the driver's ResourceSlices for the node: by
// spec.nodeName, spec.nodeSelector, spec.allNodes or
// spec.perDeviceNodeSelection (nodeslices.go).
func (r *run) slicesNow(ctx context.Context) ([]resourcev1.ResourceSlice, error) {
	l, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorDriver + "=" + r.driver})
	if err != nil {
		return nil, err
	}
	return forNode(l.Items, r.nodeObject(ctx)), nil
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
	wait := 2 * r.cfg.CallTimeout
	sl, err := r.waitSlices(ctx, wait, complete)
	if err == nil && len(sl) > 0 {
		// Judged once the driver is done publishing.
		r.settle(ctx, time.Time{})
		sl, err = r.slicesNow(ctx)
	}
	if err != nil {
		r.set(verify.CheckDRASlices, verify.Fail, "listing the ResourceSlices: %v", err)
		return r.stop("no devices: see " + verify.CheckDRASlices)
	}
	if len(sl) == 0 {
		r.set(verify.CheckDRASlices, verify.Fail, "no ResourceSlice of driver %s for node %s (by spec.nodeName, spec.nodeSelector, spec.allNodes or spec.perDeviceNodeSelection) within %s%s", r.driver, r.node, wait, r.elsewhere(ctx))
		return r.stop("no devices: see " + verify.CheckDRASlices)
	}
	node := r.nodeObject(ctx)
	var problems, how []string
	pools := map[string]bool{}
	for _, s := range sl {
		if n := len(s.Spec.Devices); n > resourcev1.ResourceSliceMaxDevices {
			problems = append(problems, fmt.Sprintf("%s has %d devices (at most %d)", s.Name, n, resourcev1.ResourceSliceMaxDevices))
		}
		if h := nodeSelection(&s); !slices.Contains(how, h) {
			how = append(how, h)
		}
		// The kubelet removes a node's slices by spec.nodeName and the
		// Node's deletion removes what it owns; a slice that selects its
		// nodes otherwise is neither's.
		owned := slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Node" && o.Name == r.node })
		if s.Spec.NodeName != nil && !owned {
			problems = append(problems, fmt.Sprintf("%s (spec.nodeName %s) is not owned by Node %s (ownerReferences)", s.Name, *s.Spec.NodeName, r.node))
		}
		pools[s.Spec.Pool.Name] = true
	}
	if !complete(sl) {
		problems = append(problems, "the pool's slices disagree on generation or resourceSliceCount")
	}
	// The checks prepare devices of the first pool with devices for the
	// node.
	sort.Slice(sl, func(i, j int) bool { return sl[i].Name < sl[j].Name })
	r.pool = sl[0].Spec.Pool.Name
	for _, s := range sl {
		if len(deviceNames([]resourcev1.ResourceSlice{s}, s.Spec.Pool.Name, node)) > 0 {
			r.pool = s.Spec.Pool.Name
			break
		}
	}
	r.generation = newestGeneration(sl, r.pool)
	r.devices = deviceNames(sl, r.pool, node)
	for _, d := range listedTwice(r.devices) {
		problems = append(problems, fmt.Sprintf("device %s is listed more than once in pool %s (generation %d): the scheduler does not allocate from such a pool", d, r.pool, r.generation))
	}
	if len(r.devices) == 0 {
		problems = append(problems, "no devices for node "+r.node+" in pool "+r.pool)
	}
	if len(problems) > 0 {
		r.set(verify.CheckDRASlices, verify.Fail, "%s", strings.Join(problems, "; "))
	} else {
		r.set(verify.CheckDRASlices, verify.Pass, "%d slice(s) for the node by %s, %d pool(s), %d device(s) in pool %s (generation %d)", len(sl), strings.Join(how, ", "), len(pools), len(r.devices), r.pool, r.generation)
	}
	r.devices = slices.Compact(r.devices)
	if len(r.devices) == 0 {
		return r.stop("no devices: see " + verify.CheckDRASlices)
	}
	return true
}

// elsewhere says which of the driver's slices are for other nodes, when
// it has some: a node selector that does not match is the usual cause.
func (r *run) elsewhere(ctx context.Context) string {
	l, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorDriver + "=" + r.driver, Limit: 5})
	if err != nil || len(l.Items) == 0 {
		return ""
	}
	var names []string
	for _, s := range l.Items {
		names = append(names, s.Name+" ("+nodeSelection(&s)+")")
	}
	return fmt.Sprintf("; the driver's slices %s select other nodes than Node %s (name %s, labels %v)", strings.Join(names, ", "), r.node, r.node, r.nodeObject(ctx).Labels)
}

// newestGeneration is the newest generation of pool among sl.
func newestGeneration(sl []resourcev1.ResourceSlice, pool string) int64 {
	gen := int64(-1)
	for _, s := range sl {
		if s.Spec.Pool.Name == pool {
			gen = max(gen, s.Spec.Pool.Generation)
		}
	}
	return gen
}

// deviceNames lists, sorted, the devices of the newest generation of
// pool that are offered to node; a name listed twice is there twice.
func deviceNames(sl []resourcev1.ResourceSlice, pool string, node *corev1.Node) []string {
	var out []string
	gen := newestGeneration(sl, pool)
	for i := range sl {
		s := &sl[i]
		if s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != gen {
			continue
		}
		for j := range s.Spec.Devices {
			if deviceForNode(s, &s.Spec.Devices[j], node) {
				out = append(out, s.Spec.Devices[j].Name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// listedTwice lists the names that sorted lists more than once.
func listedTwice(sorted []string) []string {
	var out []string
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] && !slices.Contains(out, sorted[i]) {
			out = append(out, sorted[i])
		}
	}
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
		return complete(sl) && slices.Equal(deviceNames(sl, r.pool, node), r.devices)
	})
	switch now := deviceNames(sl, r.pool, node); {
	case err != nil:
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "listing the ResourceSlices: %v", err)
	case !complete(sl):
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "no complete pool %s for node %s within %s after the restart", r.pool, r.node, wait)
	case !slices.Equal(now, r.devices):
		r.set(verify.CheckDRASlicesRestart, verify.Fail, "pool %s lists %q after the restart, %q before", r.pool, now, r.devices)
	default:
		r.set(verify.CheckDRASlicesRestart, verify.Pass, "pool %s: %d device(s), generation %d (was %d)", r.pool, len(r.devices), newestGeneration(sl, r.pool), r.generation)
	}
	r.checkReboot(ctx)
	return true
}
