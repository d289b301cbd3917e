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
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
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
	nodeObj *corev1.Node
	pool    string
	devices []string
	// published are the devices the pool lists for the node; devices
	// are those of them the checks hold, all of which fit at once.
	published   []string
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
