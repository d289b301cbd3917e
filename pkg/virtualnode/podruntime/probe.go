package podruntime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/internal/podspec"
)

// Container probes, as the kubelet's prober (pkg/kubelet/prober): one
// worker per probe of a container for the pod's life, following the
// runtime container that currently runs it. Readiness decides the
// container's ready and the pod's Ready condition; a startup probe holds
// the others back until it passed and reports the container started; a
// liveness or startup probe that fails kills the container, which then
// restarts as its restart policy says. The runner gives the worker its
// view of the container and the means to exec in and kill it
// (ProbeTarget); the decisions are made here.

// ProbeKind is one of a container's three probes.
type ProbeKind int

// The probe kinds; each indexes ProbeResults.
const (
	Readiness ProbeKind = iota
	Liveness
	Startup
)

// ProbeKinds are every kind, in the order their workers start.
var ProbeKinds = [...]ProbeKind{Readiness, Liveness, Startup}

// String is the kubelet's name of the probe kind, as its events show it.
func (k ProbeKind) String() string {
	switch k {
	case Readiness:
		return "Readiness"
	case Liveness:
		return "Liveness"
	default:
		return "Startup"
	}
}

// Spec is the container's probe of this kind, nil when it has none.
func (k ProbeKind) Spec(c *corev1.Container) *corev1.Probe {
	switch k {
	case Readiness:
		return c.ReadinessProbe
	case Liveness:
		return c.LivenessProbe
	default:
		return c.StartupProbe
	}
}

// ProbeResult is what a probe found, as the kubelet's results manager
// keeps it.
type ProbeResult int

// The results of a probe after its thresholds.
const (
	ResultUnknown ProbeResult = iota
	ResultSuccess
	ResultFailure
)

// Outcome is one probe's answer before thresholds, as the kubelet's
// pkg/probe results: a warning counts as success, with an event.
type Outcome int

// The outcomes of one probe.
const (
	OutcomeUnknown Outcome = iota
	OutcomeSuccess
	OutcomeWarning
	OutcomeFailure
)

func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case OutcomeWarning:
		return "warning"
	case OutcomeFailure:
		return "failure"
	default:
		return "unknown"
	}
}

// maxProbeRetries is how often a probe that errors (as opposed to fails)
// is tried at once, as the kubelet's.
const maxProbeRetries = 3

// MaxExecOutput is the kubelet's limit on what an exec probe keeps of its
// output.
const MaxExecOutput = 10 << 10

// ProbeResults is what a container's probes found, each for the runtime
// container it probed; the runner keeps it under its lock.
type ProbeResults struct {
	results [len(ProbeKinds)]struct {
		id     string
		result ProbeResult
	}
}

// Get is kind's result for runtime container id: ResultUnknown when the
// last result was for another.
func (s *ProbeResults) Get(k ProbeKind, id string) ProbeResult {
	if r := s.results[k]; r.id == id {
		return r.result
	}
	return ResultUnknown
}

// Set records kind's result for runtime container id.
func (s *ProbeResults) Set(k ProbeKind, id string, r ProbeResult) {
	s.results[k].id, s.results[k].result = id, r
}

// Started reports whether runtime container id of spec started: its
// startup probe, if any, passed.
func (s *ProbeResults) Started(spec *corev1.Container, id string) bool {
	return spec.StartupProbe == nil || s.Get(Startup, id) == ResultSuccess
}

// ProbeView is the probed container as its runner sees it.
type ProbeView struct {
	// ID is the runtime container that runs it now; "" before the first.
	ID string
	// Running: the runtime container runs; Exited: it has exited.
	Running, Exited bool
	// PostStarting: its postStart hook runs, and it does not count as
	// running for its probes yet (the kubelet reports it running only
	// once the hook returned).
	PostStarting bool
	// Stopping: the pod is being deleted.
	Stopping bool
	// StartedAt is when the runtime container started.
	StartedAt time.Time
	// PodIP is the address network probes reach: the pod's, or the
	// node's for a pod on the host's network.
	PodIP string
}

// ExecFunc runs cmd in runtime container id and returns its output
// (stdout, then stderr) and exit code. timeout 0 runs it until ctx ends;
// past a timeout it returns an error wrapping ErrExecTimedOut.
type ExecFunc func(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error)

// ErrExecTimedOut is wrapped by an ExecFunc's error when the command ran
// past its timeout.
var ErrExecTimedOut = errors.New("command timed out")

// ProbeTarget is what a probe worker needs of the runner of the probed
// container.
type ProbeTarget interface {
	// Inspect calls f under the runner's lock with the container's view
	// and its probe results, which f may change.
	Inspect(f func(v ProbeView, r *ProbeResults))
	// Exec runs a command in a runtime container of the probed one.
	Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error)
	// Event records an event about the container.
	Event(eventType, reason, message string)
	// Kill kills runtime container id, whose liveness or startup probe
	// failed, with message; it restarts as its restart policy says.
	Kill(ctx context.Context, id string, kind ProbeKind, message string)
}

// Ticker paces a probe worker instead of its period (tests): it returns
// the ticks, the first probe's included, and what stops them.
type Ticker func(name string, period time.Duration) (<-chan time.Time, func())

// ProbeWorker runs one probe of one container for the pod's life.
type ProbeWorker struct {
	pod    *corev1.Pod
	c      *corev1.Container
	kind   ProbeKind
	spec   corev1.Probe // defaulted
	target ProbeTarget
	tick   Ticker
	// trigger asks for a probe now.
	trigger chan struct{}

	// The worker's own state, as the kubelet worker's.
	id     string // the runtime container followed
	onHold bool   // a result that acts was set for this container: wait for the next
	last   Outcome
	run    int // how many probes in a row gave last
}

// NewProbeWorker returns the worker of c's probe of kind, which c must
// have; tick, when not nil, paces it instead of the probe's period.
func NewProbeWorker(pod *corev1.Pod, c *corev1.Container, kind ProbeKind, target ProbeTarget, tick Ticker) *ProbeWorker {
	return &ProbeWorker{
		pod: pod, c: c, kind: kind, spec: DefaultProbe(*kind.Spec(c)), target: target, tick: tick,
		trigger: make(chan struct{}, 1),
	}
}

// Trigger asks the worker to probe now rather than at its next period,
// as the kubelet does for the readiness of a container that started but
// is not ready. It does not block.
func (w *ProbeWorker) Trigger() {
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// StartProbes starts a worker for every probe of the pod's init and app
// containers, each with the target target returns for its container. It
// returns the readiness workers by container name, which Probed
// triggers, and what stops every worker and waits for them.
func StartProbes(ctx context.Context, pod *corev1.Pod, target func(*corev1.Container) ProbeTarget, tick Ticker) (readiness map[string]*ProbeWorker, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	readiness = map[string]*ProbeWorker{}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			c := &cs[i]
			for _, k := range ProbeKinds {
				if k.Spec(c) == nil {
					continue
				}
				w := NewProbeWorker(pod, c, k, target(c), tick)
				if k == Readiness {
					readiness[c.Name] = w
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					w.Run(ctx)
				}()
			}
		}
	}
	return readiness, func() {
		cancel()
		wg.Wait()
	}
}

// Probed answers the Probed of ComputeProbedStatus for a running
// container spec whose runtime container is id: started as its startup
// probe says, ready as its readiness probe says. Like the kubelet's
// UpdatePodStatus, a container that started but is not ready has its
// readiness probed at once (by readiness, its worker, when not nil)
// rather than at the next period.
func (s *ProbeResults) Probed(spec *corev1.Container, id string, readiness *ProbeWorker) (started, ready bool) {
	if !s.Started(spec, id) {
		return false, false
	}
	if spec.ReadinessProbe == nil || s.Get(Readiness, id) == ResultSuccess {
		return true, true
	}
	if readiness != nil {
		readiness.Trigger()
	}
	return true, false
}

// DefaultProbe applies the API server's defaults, for pods that did not
// come through it.
func DefaultProbe(p corev1.Probe) corev1.Probe {
	if p.PeriodSeconds <= 0 {
		p.PeriodSeconds = 10
	}
	if p.TimeoutSeconds <= 0 {
		p.TimeoutSeconds = 1
	}
	if p.SuccessThreshold <= 0 {
		p.SuccessThreshold = 1
	}
	if p.FailureThreshold <= 0 {
		p.FailureThreshold = 3
	}
	return p
}

func (w *ProbeWorker) name() string { return w.c.Name + "/" + w.kind.String() }

// Run probes at once, then every period and on triggers, until ctx ends
// or the probe is done (a pod being deleted is not killed any more).
func (w *ProbeWorker) Run(ctx context.Context) {
	period := time.Duration(w.spec.PeriodSeconds) * time.Second
	var tick <-chan time.Time
	reset := func() {}
	waitFirst := false // tests tick the first probe too
	if w.tick != nil {
		var stop func()
		tick, stop = w.tick(w.name(), period)
		defer stop()
		waitFirst = true
	} else {
		t := time.NewTicker(period)
		defer t.Stop()
		tick, reset = t.C, func() { t.Reset(period) }
	}
	for waitFirst || w.doProbe(ctx) {
		waitFirst = false
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-w.trigger:
			reset()
		}
	}
}

// doProbe is one round of the kubelet worker's doProbe: follow the
// container that runs now, wait for its initial delay and for its
// startup probe, probe, apply the thresholds and act on the result.
func (w *ProbeWorker) doProbe(ctx context.Context) (keepGoing bool) {
	const (
		wait = iota
		done
		probe
	)
	act := wait
	var id, podIP string
	w.target.Inspect(func(v ProbeView, r *ProbeResults) {
		if v.ID == "" {
			return
		}
		if w.id != v.ID {
			w.id, w.onHold = v.ID, false
			w.last, w.run = OutcomeUnknown, 0
			initial := ResultFailure // readiness: not ready until probed
			switch w.kind {
			case Liveness:
				initial = ResultSuccess
			case Startup:
				initial = ResultUnknown
			}
			r.Set(w.kind, w.id, initial)
		}
		if w.onHold {
			return
		}
		if v.Exited || !v.Running || v.PostStarting {
			if v.Exited {
				r.Set(w.kind, w.id, ResultFailure)
			}
			return
		}
		if v.Stopping && w.kind != Readiness {
			// As the kubelet: a pod being deleted is not killed for its
			// liveness or startup any more.
			r.Set(w.kind, w.id, ResultSuccess)
			act = done
			return
		}
		if time.Since(v.StartedAt) < time.Duration(w.spec.InitialDelaySeconds)*time.Second {
			return
		}
		if r.Started(w.c, w.id) == (w.kind == Startup) {
			// A startup probe is done once the container started; the
			// others wait for it.
			return
		}
		act, id, podIP = probe, w.id, v.PodIP
	})
	switch act {
	case wait:
		return true
	case done:
		return false
	}

	out, output, err := w.probe(ctx, id, podIP)
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		w.target.Event(corev1.EventTypeWarning, EventUnhealthy, ProbeErroredMessage(w.kind.String(), out.String(), err))
		return true
	}
	var result ProbeResult
	switch out {
	case OutcomeSuccess:
		result = ResultSuccess
	case OutcomeWarning:
		w.target.Event(corev1.EventTypeWarning, EventProbeWarning, ProbeWarningMessage(w.kind.String(), output))
		result, out = ResultSuccess, OutcomeSuccess
	case OutcomeFailure:
		w.target.Event(corev1.EventTypeWarning, EventUnhealthy, ProbeFailedMessage(w.kind.String(), output))
		result = ResultFailure
	default:
		result, out = ResultFailure, OutcomeFailure
	}
	if out == w.last {
		w.run++
	} else {
		w.last, w.run = out, 1
	}
	if result == ResultFailure && w.run < int(w.spec.FailureThreshold) || result == ResultSuccess && w.run < int(w.spec.SuccessThreshold) {
		return true
	}
	current := false
	w.target.Inspect(func(v ProbeView, r *ProbeResults) {
		if current = v.ID == id && !v.Exited; current {
			r.Set(w.kind, id, result)
		}
	})
	if !current {
		return true
	}
	if w.kind == Liveness && result == ResultFailure || w.kind == Startup {
		w.onHold, w.run = true, 0
	}
	if w.kind != Readiness && result == ResultFailure {
		restart := podspec.IsSidecar(w.c) || w.pod.Spec.RestartPolicy != corev1.RestartPolicyNever
		msg := ProbeKillMessage(w.c.Name, w.kind.String(), restart)
		w.target.Kill(ctx, id, w.kind, msg)
	}
	return true
}

// probe runs the probe once, retrying what errors as the kubelet does.
func (w *ProbeWorker) probe(ctx context.Context, id, podIP string) (Outcome, string, error) {
	var (
		out    Outcome
		output string
		err    error
	)
	for range maxProbeRetries {
		out, output, err = w.probeOnce(ctx, id, podIP)
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	return out, output, err
}

func (w *ProbeWorker) probeOnce(ctx context.Context, id, podIP string) (Outcome, string, error) {
	timeout := time.Duration(w.spec.TimeoutSeconds) * time.Second
	p, spec := &w.spec, w.c
	switch {
	case p.Exec != nil:
		return ExecProbe(ctx, w.target.Exec, id, ExpandStatic(p.Exec.Command, spec.Env), timeout)
	case p.HTTPGet != nil:
		req, err := NewHTTPRequest(ctx, p.HTTPGet, spec, podIP, "probe")
		if err != nil {
			return OutcomeUnknown, "", err
		}
		return HTTPProbe(req, timeout)
	case p.TCPSocket != nil:
		port, err := ResolvePort(p.TCPSocket.Port, spec)
		if err != nil {
			return OutcomeUnknown, "", err
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		return TCPProbe(ctx, host, port, timeout)
	case p.GRPC != nil:
		service := ""
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		return GRPCProbe(ctx, podIP, service, int(p.GRPC.Port), timeout)
	}
	return OutcomeUnknown, "", fmt.Errorf("missing probe handler for %s:%s", PodName(w.pod), spec.Name)
}

// ExpandStatic expands $(VAR) in a probe's command with the container's
// literal environment only, as the kubelet
// (ExpandContainerCommandOnlyStatic): variables from sources read as
// empty.
func ExpandStatic(cmd []string, env []corev1.EnvVar) []string {
	vars := map[string]string{}
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	out := make([]string, len(cmd))
	for i, a := range cmd {
		out[i] = Expand(a, vars)
	}
	return out
}

// ExecProbe is the kubelet's exec prober: exit 0 passes, another exit
// code or a timeout fails, with the command's output (10 KiB at most).
func ExecProbe(ctx context.Context, exec ExecFunc, id string, cmd []string, timeout time.Duration) (Outcome, string, error) {
	out, code, err := exec(ctx, id, cmd, timeout)
	if len(out) > MaxExecOutput {
		out = out[:MaxExecOutput]
	}
	switch {
	case errors.Is(err, ErrExecTimedOut):
		return OutcomeFailure, err.Error(), nil
	case err != nil:
		return OutcomeUnknown, "", err
	case code != 0:
		return OutcomeFailure, string(out), nil
	}
	return OutcomeSuccess, string(out), nil
}
