package cri

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	remote "k8s.io/cri-client/pkg"
	utilexec "k8s.io/utils/exec"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Container probes, as the kubelet's prober (pkg/kubelet/prober): one
// worker per probe of a container for the pod's life, following the
// container that currently runs it. Readiness decides the container's
// ready and the pod's Ready condition; a startup probe holds the others
// back until it passed and reports the container started; a liveness or
// startup probe that fails kills the container, which then restarts as
// its restart policy says.

type probeKind int

const (
	readiness probeKind = iota
	liveness
	startup
)

// String is the kubelet's name of the probe kind, as its events show it.
func (k probeKind) String() string {
	switch k {
	case readiness:
		return "Readiness"
	case liveness:
		return "Liveness"
	default:
		return "Startup"
	}
}

func (k probeKind) spec(c *corev1.Container) *corev1.Probe {
	switch k {
	case readiness:
		return c.ReadinessProbe
	case liveness:
		return c.LivenessProbe
	default:
		return c.StartupProbe
	}
}

// probeResult is what a probe found, as the kubelet's results manager
// keeps it.
type probeResult int

const (
	resultUnknown probeResult = iota
	resultSuccess
	resultFailure
)

// outcome is one probe's answer before thresholds, as the kubelet's
// pkg/probe results: warning counts as success, with an event.
type outcome int

const (
	outcomeUnknown outcome = iota
	outcomeSuccess
	outcomeWarning
	outcomeFailure
)

func (o outcome) String() string {
	switch o {
	case outcomeSuccess:
		return "success"
	case outcomeWarning:
		return "warning"
	case outcomeFailure:
		return "failure"
	default:
		return "unknown"
	}
}

// maxProbeRetries is how often a probe that errors (as opposed to fails)
// is tried at once, as the kubelet's.
const maxProbeRetries = 3

// runtimeRequestTimeout is the kubelet's default --runtime-request-timeout,
// which bounds each call to the runtime, an exec beyond its own timeout.
const runtimeRequestTimeout = 2 * time.Minute

// probeState is what a container's probes found for its current runtime
// container; guarded by the pod's mutex.
type probeState struct {
	results [3]struct {
		id     string
		result probeResult
	}
	// postStarting: its postStart hook runs, and the container does not
	// count as running for its probes yet (the kubelet reports it running
	// only once the hook returned).
	postStarting bool
	// triggerReadiness asks its readiness worker to probe now.
	triggerReadiness chan struct{}
}

func (s *probeState) get(k probeKind, id string) probeResult {
	if r := s.results[k]; r.id == id {
		return r.result
	}
	return resultUnknown
}

func (s *probeState) set(k probeKind, id string, r probeResult) {
	s.results[k].id, s.results[k].result = id, r
}

// startedLocked reports whether c's current container started: it runs
// and its startup probe, if any, passed.
func (c *ctr) startedLocked() bool {
	return c.spec.StartupProbe == nil || c.probe.get(startup, c.id) == resultSuccess
}

// started is startedLocked for the pod's run loop.
func (pr *podRun) started(c *ctr) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return c.startedLocked()
}

// probedLocked answers podruntime.Probed for a running container: started as
// its startup probe says, ready as its readiness probe says. Like the
// kubelet's UpdatePodStatus, a container that started but is not ready
// has its readiness probed at once rather than at the next period.
func (pr *podRun) probedLocked(name string) (started, ready bool) {
	for _, c := range pr.ctrs {
		if c.spec.Name != name {
			continue
		}
		if !c.startedLocked() {
			return false, false
		}
		if c.spec.ReadinessProbe == nil {
			return true, true
		}
		if c.probe.get(readiness, c.id) == resultSuccess {
			return true, true
		}
		select {
		case c.probe.triggerReadiness <- struct{}{}:
		default:
		}
		return true, false
	}
	return true, true
}

// probeWorker runs one probe of one container of the pod.
type probeWorker struct {
	pr   *podRun
	c    *ctr
	kind probeKind
	spec corev1.Probe // defaulted
	// trigger asks for a probe now (readiness only).
	trigger chan struct{}

	// The worker's own state, as the kubelet worker's.
	id     string // the runtime container followed
	onHold bool   // a result that acts was set for this container: wait for the next
	last   outcome
	run    int // how many probes in a row gave last
}

// startProbes starts a worker for every probe of the pod's containers and
// returns what stops them and waits for them.
func (pr *podRun) startProbes(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, c := range pr.ctrs {
		for _, k := range []probeKind{readiness, liveness, startup} {
			spec := k.spec(&c.spec)
			if spec == nil {
				continue
			}
			w := &probeWorker{pr: pr, c: c, kind: k, spec: defaultProbe(*spec)}
			if k == readiness {
				w.trigger = make(chan struct{}, 1)
				pr.mu.Lock()
				c.probe.triggerReadiness = w.trigger
				pr.mu.Unlock()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				w.loop(ctx)
			}()
		}
	}
	return func() {
		cancel()
		wg.Wait()
	}
}

// defaultProbe applies the API server's defaults, for pods that did not
// come through it.
func defaultProbe(p corev1.Probe) corev1.Probe {
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

func (w *probeWorker) name() string { return w.c.spec.Name + "/" + w.kind.String() }

// loop probes at once, then every period and on triggers, until ctx
// ends or doProbe says the probe is done.
func (w *probeWorker) loop(ctx context.Context) {
	period := time.Duration(w.spec.PeriodSeconds) * time.Second
	var tick <-chan time.Time
	reset := func() {}
	waitFirst := false // tests tick the first probe too
	if nt := w.pr.b.cfg.probeTicker; nt != nil {
		var stop func()
		tick, stop = nt(w.name(), period)
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
func (w *probeWorker) doProbe(ctx context.Context) (keepGoing bool) {
	pr, c := w.pr, w.c
	pr.mu.Lock()
	if c.id == "" {
		pr.mu.Unlock()
		return true
	}
	if w.id != c.id {
		w.id, w.onHold = c.id, false
		w.last, w.run = outcomeUnknown, 0
		initial := resultFailure // readiness: not ready until probed
		switch w.kind {
		case liveness:
			initial = resultSuccess
		case startup:
			initial = resultUnknown
		}
		c.probe.set(w.kind, w.id, initial)
	}
	if w.onHold {
		pr.mu.Unlock()
		return true
	}
	if c.exited || c.state.Running == nil || c.probe.postStarting {
		if c.exited {
			c.probe.set(w.kind, w.id, resultFailure)
		}
		pr.mu.Unlock()
		return true
	}
	if pr.stopping && w.kind != readiness {
		// As the kubelet: a pod being deleted is not killed for its
		// liveness or startup any more.
		c.probe.set(w.kind, w.id, resultSuccess)
		pr.mu.Unlock()
		return false
	}
	if time.Since(c.started) < time.Duration(w.spec.InitialDelaySeconds)*time.Second {
		pr.mu.Unlock()
		return true
	}
	started := c.startedLocked()
	if started == (w.kind == startup) {
		// A startup probe is done once the container started; the others
		// wait for it.
		pr.mu.Unlock()
		return true
	}
	id, podIP := w.id, pr.statusIPLocked()
	pr.mu.Unlock()

	out, output, err := w.probe(ctx, id, podIP)
	if ctx.Err() != nil {
		return false
	}
	if err != nil {
		pr.event(c, corev1.EventTypeWarning, podruntime.EventUnhealthy, podruntime.ProbeErroredMessage(w.kind.String(), out.String(), err))
		return true
	}
	var result probeResult
	switch out {
	case outcomeSuccess:
		result = resultSuccess
	case outcomeWarning:
		pr.event(c, corev1.EventTypeWarning, podruntime.EventProbeWarning, podruntime.ProbeWarningMessage(w.kind.String(), output))
		result, out = resultSuccess, outcomeSuccess
	case outcomeFailure:
		pr.event(c, corev1.EventTypeWarning, podruntime.EventUnhealthy, podruntime.ProbeFailedMessage(w.kind.String(), output))
		result = resultFailure
	default:
		result, out = resultFailure, outcomeFailure
	}
	if out == w.last {
		w.run++
	} else {
		w.last, w.run = out, 1
	}
	if result == resultFailure && w.run < int(w.spec.FailureThreshold) || result == resultSuccess && w.run < int(w.spec.SuccessThreshold) {
		return true
	}
	pr.mu.Lock()
	current := c.id == id && !c.exited
	if current {
		c.probe.set(w.kind, id, result)
	}
	pr.mu.Unlock()
	if !current {
		return true
	}
	if w.kind == liveness && result == resultFailure || w.kind == startup {
		w.onHold, w.run = true, 0
	}
	if w.kind != readiness && result == resultFailure {
		pr.killUnhealthy(ctx, c, id, w.kind)
	}
	return true
}

// killUnhealthy kills a container whose liveness or startup probe failed,
// with the kubelet's Killing message; it restarts as its restart policy
// says.
func (pr *podRun) killUnhealthy(ctx context.Context, c *ctr, id string, kind probeKind) {
	msg := podruntime.ProbeKillMessage(c.spec.Name, kind.String(), c.sidecar || pr.pod.Spec.RestartPolicy != corev1.RestartPolicyNever)
	pr.killContainer(ctx, c, id, msg, pr.killGrace(kind.spec(&c.spec)))
}

// statusIPLocked is the pod's IP as its status reports it: the sandbox's,
// or the node's for a pod on the host's network.
func (pr *podRun) statusIPLocked() string {
	if pr.podIP != "" {
		return pr.podIP
	}
	return pr.b.cfg.NodeIP
}

// event records an event about c.
func (pr *podRun) event(c *ctr, eventType, reason, message string) {
	if pr.b.cfg.Event != nil {
		pr.b.cfg.Event(pr.pod, c.spec.Name, eventType, reason, message)
	}
}

// probe runs the probe once, retrying what errors as the kubelet does.
func (w *probeWorker) probe(ctx context.Context, id, podIP string) (outcome, string, error) {
	var (
		out    outcome
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

func (w *probeWorker) probeOnce(ctx context.Context, id, podIP string) (outcome, string, error) {
	timeout := time.Duration(w.spec.TimeoutSeconds) * time.Second
	p, spec := &w.spec, &w.c.spec
	switch {
	case p.Exec != nil:
		return w.pr.execProbe(ctx, id, expandStatic(p.Exec.Command, spec.Env), timeout)
	case p.HTTPGet != nil:
		req, err := newHTTPRequest(ctx, p.HTTPGet, spec, podIP, "probe")
		if err != nil {
			return outcomeUnknown, "", err
		}
		return httpProbe(req, timeout)
	case p.TCPSocket != nil:
		port, err := resolvePort(p.TCPSocket.Port, spec)
		if err != nil {
			return outcomeUnknown, "", err
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		return tcpProbe(ctx, host, port, timeout)
	case p.GRPC != nil:
		service := ""
		if p.GRPC.Service != nil {
			service = *p.GRPC.Service
		}
		return grpcProbe(ctx, podIP, service, int(p.GRPC.Port), timeout)
	}
	return outcomeUnknown, "", fmt.Errorf("missing probe handler for %s:%s", formatPod(w.pr.pod), spec.Name)
}

// formatPod is the kubelet's format.Pod: name_namespace(uid).
func formatPod(p *corev1.Pod) string { return fmt.Sprintf("%s_%s(%s)", p.Name, p.Namespace, p.UID) }

// expandStatic expands $(VAR) in a probe's command with the container's
// literal environment only, as the kubelet
// (ExpandContainerCommandOnlyStatic): variables from sources read as
// empty.
func expandStatic(cmd []string, env []corev1.EnvVar) []string {
	vars := map[string]string{}
	for _, e := range env {
		vars[e.Name] = e.Value
	}
	out := make([]string, len(cmd))
	for i, a := range cmd {
		out[i] = podruntime.Expand(a, vars)
	}
	return out
}

// maxExecOutput is the kubelet's limit on what an exec probe keeps of its
// output.
const maxExecOutput = 10 << 10

// execSync runs cmd in the container through the runtime's ExecSync and
// returns its output (stdout, then stderr) and exit code. timeout 0 runs
// it until ctx ends; else the call is bounded by timeout and the
// RequestTimeout beyond it, and an exec past it is an error wrapping
// remote.ErrCommandTimedOut, as the kubelet's.
func (pr *podRun) execSync(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	stdout, stderr, err := pr.b.rt.ExecSync(pr.b.logctx(ctx), id, cmd, timeout)
	var exit utilexec.CodeExitError
	switch {
	case errors.As(err, &exit):
		return append(stdout, stderr...), int32(exit.Code), nil //nolint:gosec // the runtime's int32
	case err != nil:
		return nil, 0, err
	}
	return append(stdout, stderr...), 0, nil
}

// execProbe is the kubelet's exec prober: exit 0 passes, another exit
// code or a timeout fails, with the command's output (10 KiB at most).
func (pr *podRun) execProbe(ctx context.Context, id string, cmd []string, timeout time.Duration) (outcome, string, error) {
	out, code, err := pr.execSync(ctx, id, cmd, timeout)
	if len(out) > maxExecOutput {
		out = out[:maxExecOutput]
	}
	switch {
	case errors.Is(err, remote.ErrCommandTimedOut):
		return outcomeFailure, err.Error(), nil
	case err != nil:
		return outcomeUnknown, "", err
	case code != 0:
		return outcomeFailure, string(out), nil
	}
	return outcomeSuccess, string(out), nil
}
