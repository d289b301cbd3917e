package podruntime

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/podspec"
)

// The pod worker: one goroutine per pod that does what the kubelet's pod
// worker and SyncPod do between admission and the container runtime.
// Each sync readies what the containers share, reads every container's
// state, then starts what should run: the init containers one at a time
// (a sidecar's successor once it started), then the app containers, each
// restarted as the restart policy says after its back-off. Deleting the
// pod kills its containers (preStop hooks within the grace period) and
// tears the rest down. The runner does only what needs a runtime.

// Runner is what a Worker needs of a backend for one pod: it starts,
// stops, execs and observes the pod's containers. A run of a container
// (one runtime container, one process) is named by the ID Start gave it.
type Runner interface {
	// Prepare readies what the pod's containers share (volumes, a
	// sandbox) at the start of each sync and reports whether containers
	// may start. An error (a sandbox that could not be made) becomes the
	// message of the containers still waiting; Prepare records its own
	// event and when to try again.
	Prepare(ctx context.Context) (ready bool, err error)
	// Start creates and starts run attempt (0 first) of container c. A
	// *WaitError names the Waiting reason to report; a Started with an ID
	// beside an error is a run created that did not start.
	Start(ctx context.Context, c *corev1.Container, attempt int32) (Started, error)
	// Observe reads run id of container c; an error wrapping
	// ErrContainerGone when the runtime no longer knows it.
	Observe(ctx context.Context, c *corev1.Container, id string) (Observed, error)
	// Stop stops run id: a termination signal, then a kill once grace
	// seconds have passed (at once when 0). It returns when the run has
	// stopped or ctx ended.
	Stop(ctx context.Context, id string, grace int64)
	// Remove removes a dead run, kept until then for its logs.
	Remove(ctx context.Context, id string)
	// Exec runs cmd beside run id (probes and hooks), as an ExecFunc.
	Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error)
	// ContainerID is run id as the status names it ("containerd://…").
	ContainerID(id string) string
	// PodIP is the pod's address; "" for the node's.
	PodIP() string
	// Ended is called once when the pod reached a terminal phase (the
	// kubelet stops its sandbox then; the containers stay for their
	// logs).
	Ended(ctx context.Context)
	// Teardown is called once the deleted pod's containers stopped; it
	// removes what Prepare made.
	Teardown(ctx context.Context)
}

// Started is a run that Start created.
type Started struct {
	ID string
	// ImageID is the image it runs, as the status reports it.
	ImageID string
}

// Observed is the state of a run.
type Observed struct {
	// Running with StartedAt, or Terminated once it ended.
	Running    bool
	StartedAt  time.Time
	Terminated *corev1.ContainerStateTerminated
	// ImageID, when known.
	ImageID string
}

// ErrContainerGone is wrapped by Runner.Observe's error when the run is
// unknown to the runtime: it is reported terminated, status unknown.
var ErrContainerGone = errors.New("container is gone")

// WaitError is a start that failed with a Waiting reason of the
// kubelet's (CreateContainerConfigError, ErrImagePull...).
type WaitError struct{ Reason, Message string }

func (e *WaitError) Error() string { return e.Reason + ": " + e.Message }

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	// NodeIP is the pods' hostIP, and podIP of those without their own.
	NodeIP string
	// BackoffInitial and BackoffMax bound the restart and image pull
	// back-off (the kubelet's 10s and 5m when zero).
	BackoffInitial, BackoffMax time.Duration
	// PollInterval is how often the containers' states are read when
	// the runner does not Wake the worker first. Default 1s.
	PollInterval time.Duration
	// Notify receives a copy of the pod each time its status changed.
	Notify func(*corev1.Pod)
	// Event records an event about the pod or one of its containers. May
	// be nil.
	Event func(pod *corev1.Pod, container, eventType, reason, message string)
	// Logger; nil discards.
	Logger *slog.Logger
	// ProbeTicker, when set, paces the probe workers (tests).
	ProbeTicker Ticker
}

// container is one container of the spec and the run that currently
// runs it.
type container struct {
	spec    corev1.Container
	init    bool
	sidecar bool

	id       string // the current run, "" before the first start
	prevID   string // the one before, kept for previous logs
	cid      string // the container ID the status shows
	exited   bool
	restarts int32
	started  time.Time // when the current run started

	state     corev1.ContainerState
	lastState corev1.ContainerState
	imageID   string

	backoff    Backoff
	next       time.Time // no start before
	pullFailed string    // the last image pull error, while backing off

	probes       ProbeResults
	postStarting bool // its postStart hook runs
}

// Worker runs one pod on a Runner, as the kubelet's pod worker.
type Worker struct {
	cfg WorkerConfig
	rt  Runner
	log *slog.Logger

	pod *corev1.Pod // as admitted, never changed: the runner shares it

	mu        sync.Mutex
	status    corev1.PodStatus // what the containers' states do not give
	ctrs      []*container
	readiness map[string]*ProbeWorker
	stopping  bool
	grace     time.Duration
	killing   context.Context // set while the pod's containers are killed
	ended     bool

	pubMu sync.Mutex // orders publications
	last  *corev1.PodStatus

	wake     chan struct{}
	stopCh   chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

// NewWorker returns the worker of pod on rt; its containers wait to be
// created until Run.
func NewWorker(pod *corev1.Pod, rt Runner, cfg WorkerConfig) *Worker {
	if cfg.BackoffInitial <= 0 {
		cfg.BackoffInitial = DefaultBackoffInitial
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Worker{
		cfg: cfg, rt: rt, log: log, pod: pod, status: *pod.Status.DeepCopy(),
		wake: make(chan struct{}, 1), stopCh: make(chan struct{}), done: make(chan struct{}),
	}
	for _, c := range pod.Spec.InitContainers {
		w.ctrs = append(w.ctrs, &container{spec: c, init: true, sidecar: podspec.IsSidecar(&c), backoff: w.newBackoff()})
	}
	for _, c := range pod.Spec.Containers {
		w.ctrs = append(w.ctrs, &container{spec: c, backoff: w.newBackoff()})
	}
	init, app := WaitingStatuses(pod)
	for i, c := range w.ctrs {
		if i < len(init) {
			c.state = init[i].State
		} else {
			c.state = app[i-len(init)].State
		}
	}
	return w
}

func (w *Worker) newBackoff() Backoff {
	return Backoff{Initial: w.cfg.BackoffInitial, Max: w.cfg.BackoffMax}
}

// Restore takes the containers' states from the pod's status, as a
// runner that kept it across a restart of the node persisted it: their
// restart counts, states and images; one that had terminated is not
// started again unless its restart policy says so. Call it before Run.
func (w *Worker) Restore() {
	w.mu.Lock()
	defer w.mu.Unlock()
	byName := map[string]corev1.ContainerStatus{}
	for _, s := range append(append([]corev1.ContainerStatus{}, w.pod.Status.InitContainerStatuses...), w.pod.Status.ContainerStatuses...) {
		byName[s.Name] = s
	}
	for _, c := range w.ctrs {
		s, ok := byName[c.spec.Name]
		if !ok {
			continue
		}
		c.restarts, c.state, c.lastState, c.imageID, c.cid = s.RestartCount, s.State, s.LastTerminationState, s.ImageID, s.ContainerID
		if t := s.State.Terminated; t != nil {
			c.exited = true
			c.next = t.FinishedAt.Add(c.backoff.Delay())
		}
	}
}

// Adopted is a run of a container found after a restart of the node.
type Adopted struct {
	ID, PrevID string
	Restarts   int32
	StartedAt  time.Time
}

// Adopt makes a the current run of container name. Call it before Run.
func (w *Worker) Adopt(name string, a Adopted) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.ctrs {
		if c.spec.Name != name {
			continue
		}
		c.id, c.prevID, c.restarts, c.started, c.exited, c.cid = a.ID, a.PrevID, a.Restarts, a.StartedAt, false, ""
		c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(a.StartedAt.Truncate(time.Second))}}
	}
}

// Pod is the pod as admitted; it implements Run.
func (w *Worker) Pod() *corev1.Pod { return w.pod }

// Snapshot is a copy of the pod with its current status; it implements
// Run.
func (w *Worker) Snapshot() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pod.DeepCopy()
	p.Status = *w.statusLocked()
	return p
}

// StartTime is when the pod started, nil before.
func (w *Worker) StartTime() *metav1.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status.StartTime.DeepCopy()
}

// ContainerRun is what the worker knows of a container's current run.
type ContainerRun struct {
	Name string
	// ID is the current run, PrevID the one before (previous logs).
	ID, PrevID string
	Restarts   int32
	// Running: ID has started and not exited.
	Running   bool
	StartedAt time.Time
}

// Containers returns every container's current run, init containers
// first.
func (w *Worker) Containers() []ContainerRun {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]ContainerRun, 0, len(w.ctrs))
	for _, c := range w.ctrs {
		out = append(out, ContainerRun{
			Name: c.spec.Name, ID: c.id, PrevID: c.prevID, Restarts: c.restarts,
			Running: c.id != "" && !c.exited, StartedAt: c.started,
		})
	}
	return out
}

// Container returns container name's current run.
func (w *Worker) Container(name string) (ContainerRun, bool) {
	for _, c := range w.Containers() {
		if c.Name == name {
			return c, true
		}
	}
	return ContainerRun{}, false
}

// Wake asks for a sync now, as when the runner saw a run exit. It does
// not block.
func (w *Worker) Wake() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Stop asks for the pod's deletion with grace, the shortest asked
// winning: a shorter one while the containers are being killed kills
// them again with it (the pod is forgotten: 0 kills at once).
func (w *Worker) Stop(grace time.Duration) {
	w.mu.Lock()
	shorter := w.stopping && grace < w.grace
	if !w.stopping || shorter {
		w.grace = grace
	}
	w.stopping = true
	killing := w.killing
	var ids []string
	if shorter && killing != nil {
		for _, c := range w.ctrs {
			if c.id != "" && !c.exited {
				ids = append(ids, c.id)
			}
		}
	}
	w.mu.Unlock()
	w.stopOnce.Do(func() { close(w.stopCh) })
	for _, id := range ids {
		go w.rt.Stop(killing, id, int64(grace/time.Second))
	}
}

// Done is closed once Run returned.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Run runs the pod until it is deleted (Stop), then kills its containers
// and tears it down; it returns early, leaving what runs running, when
// ctx ends.
func (w *Worker) Run(ctx context.Context) {
	defer close(w.done)
	defer w.startProbes(ctx)()
	// Starts end with the pod's deletion: an image pull or a container
	// waiting for its environment is not waited for.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.stopCh:
			cancel()
		case <-sctx.Done():
		}
	}()
	t := time.NewTicker(w.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stopCh:
			w.terminate(ctx)
			return
		case <-ctx.Done():
			return
		default:
		}
		w.sync(ctx, sctx)
		w.publish()
		w.mu.Lock()
		ph := w.statusLocked().Phase
		end := !w.ended && (ph == corev1.PodSucceeded || ph == corev1.PodFailed)
		w.ended = w.ended || end
		ended := w.ended
		w.mu.Unlock()
		if end {
			w.rt.Ended(ctx)
		}
		if ended {
			select {
			case <-w.stopCh:
			case <-ctx.Done():
			}
			continue
		}
		// As the kubelet's pod worker, requeued once a back-off ends.
		var backoff <-chan time.Time
		var bt *time.Timer
		if d, ok := w.nextStart(); ok {
			bt = time.NewTimer(d)
			backoff = bt.C
		}
		select {
		case <-w.stopCh:
		case <-ctx.Done():
		case <-t.C:
		case <-w.wake:
		case <-backoff:
		}
		if bt != nil {
			bt.Stop()
		}
	}
}

// nextStart is how long until the first back-off still running of a
// container that waits to start ends. (One that has ended already was
// seen by the last sync: what holds that container back is another.)
func (w *Worker) nextStart() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var first time.Time
	for _, c := range w.ctrs {
		if (c.id == "" || c.exited) && c.next.After(now) && (first.IsZero() || c.next.Before(first)) {
			first = c.next
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return first.Sub(now), true
}

func (w *Worker) key() string { return w.pod.Namespace + "/" + w.pod.Name }

// sync does one round: what the containers share, their states, then
// what should start (with sctx, which the deletion ends).
func (w *Worker) sync(ctx, sctx context.Context) {
	ready, err := w.rt.Prepare(ctx)
	if err != nil {
		w.mu.Lock()
		for _, c := range w.ctrs {
			if c.state.Waiting != nil {
				// A new state: the one before went out with a notification.
				c.state = waitingState(c.state.Waiting.Reason, err.Error())
			}
		}
		w.mu.Unlock()
	}
	if !ready {
		return
	}
	w.refresh(ctx)
	now := time.Now()
	for _, c := range w.ctrs {
		if !c.init {
			continue
		}
		if c.sidecar {
			w.ensure(sctx, c, now)
			if w.waitForSidecar(c) {
				return // the next waits for the sidecar to have started
			}
			continue
		}
		if w.succeeded(c) {
			continue
		}
		w.ensure(sctx, c, now)
		return
	}
	for _, c := range w.ctrs {
		if !c.init {
			w.ensure(sctx, c, now)
		}
	}
}

func (w *Worker) waitForSidecar(c *container) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return c.id == "" || c.exited || !c.probes.Started(&c.spec, c.id)
}

func (w *Worker) succeeded(c *container) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return c.exited && c.state.Terminated != nil && c.state.Terminated.ExitCode == 0
}

// refresh reads the state of every running container.
func (w *Worker) refresh(ctx context.Context) {
	for _, c := range w.ctrs {
		w.mu.Lock()
		id, skip := c.id, c.id == "" || c.exited
		w.mu.Unlock()
		if skip {
			continue
		}
		o, err := w.rt.Observe(ctx, &c.spec, id)
		if errors.Is(err, ErrContainerGone) {
			w.mu.Lock()
			w.exit(c, unknownTermination(c))
			w.mu.Unlock()
			continue
		}
		if err != nil {
			w.log.Warn("Reading a container's status", "pod", w.key(), "container", c.spec.Name, "err", err)
			continue
		}
		w.mu.Lock()
		if o.ImageID != "" {
			c.imageID = o.ImageID
		}
		switch {
		case o.Terminated != nil:
			t := o.Terminated.DeepCopy()
			if t.ContainerID == "" {
				t.ContainerID = w.rt.ContainerID(id)
			}
			w.exit(c, t)
		case o.Running:
			c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(o.StartedAt.Truncate(time.Second))}}
		}
		w.mu.Unlock()
	}
}

// exit records that c's current run ended, and when it may start again.
func (w *Worker) exit(c *container, t *corev1.ContainerStateTerminated) {
	c.exited = true
	c.state = corev1.ContainerState{Terminated: t}
	if !c.started.IsZero() {
		c.backoff.Ran(time.Since(c.started))
	}
	c.next = t.FinishedAt.Add(c.backoff.Delay())
}

func unknownTermination(c *container) *corev1.ContainerStateTerminated {
	return &corev1.ContainerStateTerminated{
		ExitCode: 137, Reason: ReasonContainerStatusUnknown, Message: MessageContainerStatusUnknown,
		StartedAt: metav1.NewTime(c.started), FinishedAt: Now(),
	}
}

// ensure starts c when it has not run yet, or should run again and its
// back-off has passed, and reports its waiting reason otherwise.
func (w *Worker) ensure(ctx context.Context, c *container, now time.Time) {
	w.mu.Lock()
	if c.id != "" && !c.exited {
		w.mu.Unlock()
		return
	}
	if c.exited && !ShouldRestart(w.pod, &c.spec, c.init, exitCode(c)) {
		w.mu.Unlock()
		return
	}
	if now.Before(c.next) {
		switch {
		case c.exited:
			if c.state.Terminated != nil {
				c.lastState = c.state
			}
			c.state = waitingState(ReasonCrashLoopBackOff, CrashLoopBackOffMessage(c.backoff.Delay(), w.pod, c.spec.Name))
		case c.pullFailed != "":
			c.state = waitingState(ReasonImagePullBackOff, ImagePullBackOffMessage(c.spec.Image, c.pullFailed))
		}
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	if err := w.start(ctx, c); err != nil {
		if ctx.Err() != nil {
			return // the pod is being deleted
		}
		w.mu.Lock()
		var we *WaitError
		if errors.As(err, &we) {
			c.state = waitingState(we.Reason, we.Message)
		} else {
			c.state = waitingState(ReasonRunContainerError, err.Error())
		}
		c.next = now.Add(c.backoff.Delay())
		c.backoff.Step()
		w.mu.Unlock()
		w.log.Warn("Starting a container", "pod", w.key(), "container", c.spec.Name, "err", err)
	}
}

func exitCode(c *container) int32 {
	if t := c.state.Terminated; t != nil {
		return t.ExitCode
	}
	if t := c.lastState.Terminated; t != nil && c.state.Waiting != nil {
		return t.ExitCode
	}
	return 0
}

func waitingState(reason, message string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
}

// start creates and starts one run of c, then runs its postStart hook.
func (w *Worker) start(ctx context.Context, c *container) error {
	w.mu.Lock()
	restart := c.id != "" || c.exited
	attempt := c.restarts
	if restart {
		attempt++
	}
	w.mu.Unlock()
	s, err := w.rt.Start(ctx, &c.spec, attempt)
	if err != nil {
		w.mu.Lock()
		var we *WaitError
		if errors.As(err, &we) && we.Reason == ReasonErrImagePull {
			c.pullFailed = we.Message
		}
		if s.ID != "" {
			c.prevID, c.id, c.exited, c.started, c.cid = c.id, s.ID, false, time.Now(), ""
		}
		w.mu.Unlock()
		return err
	}
	// Only the last dead run is kept (for previous logs), as the
	// kubelet's garbage collector keeps one per container by default.
	if c.prevID != "" {
		w.rt.Remove(ctx, c.prevID)
	}
	w.mu.Lock()
	if restart {
		c.restarts = attempt
		if t := c.lastTerminated(); t != nil {
			c.lastState = corev1.ContainerState{Terminated: t}
		}
		c.backoff.Step()
	}
	c.prevID, c.id, c.exited, c.started, c.cid = c.id, s.ID, false, time.Now(), ""
	c.pullFailed = ""
	if s.ImageID != "" {
		c.imageID = s.ImageID
	}
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: Now()}}
	w.mu.Unlock()
	w.postStart(ctx, c)
	return nil
}

func (c *container) lastTerminated() *corev1.ContainerStateTerminated {
	if c.state.Terminated != nil {
		return c.state.Terminated
	}
	return c.lastState.Terminated
}

// terminate kills every running container with the grace period, then
// tears the pod down; containers that never ran are reported as the
// kubelet reports them.
func (w *Worker) terminate(ctx context.Context) {
	w.mu.Lock()
	grace := w.grace
	w.killing = ctx
	var running []*container
	for _, c := range w.ctrs {
		if c.id != "" && !c.exited {
			running = append(running, c)
		}
	}
	w.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range running {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.kill(ctx, c, c.id, "", int64(grace/time.Second))
		}()
	}
	wg.Wait()
	w.refresh(ctx)
	w.mu.Lock()
	for _, c := range w.ctrs {
		if c.state.Terminated == nil {
			if c.state.Waiting != nil && c.lastState.Terminated != nil {
				c.state = corev1.ContainerState{Terminated: c.lastState.Terminated}
				continue
			}
			c.state = corev1.ContainerState{Terminated: unknownTermination(c)}
		}
	}
	w.mu.Unlock()
	w.rt.Teardown(ctx)
	w.publish()
}

// statusLocked computes the pod status from the containers' states.
func (w *Worker) statusLocked() *corev1.PodStatus {
	st := w.status.DeepCopy()
	st.InitContainerStatuses, st.ContainerStatuses = nil, nil
	for _, c := range w.ctrs {
		cid := c.cid
		if c.id != "" {
			cid = w.rt.ContainerID(c.id)
		}
		cs := corev1.ContainerStatus{
			Name: c.spec.Name, Image: c.spec.Image, ImageID: c.imageID,
			ContainerID: cid, RestartCount: c.restarts,
			State: c.state, LastTerminationState: c.lastState,
		}
		if c.init {
			st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
		} else {
			st.ContainerStatuses = append(st.ContainerStatuses, cs)
		}
	}
	ComputeProbedStatus(w.pod, st, w.cfg.NodeIP, w.stopping, w.probedLocked)
	if ip := w.rt.PodIP(); ip != "" {
		st.PodIP = ip
		st.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	w.status.StartTime = st.StartTime
	w.status.Conditions = st.Conditions
	return st
}

// publish reports the pod's status when it changed.
func (w *Worker) publish() {
	w.pubMu.Lock()
	defer w.pubMu.Unlock()
	w.mu.Lock()
	st := w.statusLocked()
	if w.last != nil && equality.Semantic.DeepEqual(w.last, st) {
		w.mu.Unlock()
		return
	}
	w.last = st.DeepCopy()
	p := w.pod.DeepCopy()
	p.Status = *st
	w.mu.Unlock()
	if w.cfg.Notify != nil {
		w.cfg.Notify(p)
	}
}

// Publish reports the pod's status now if it changed (a runner whose own
// state changed, as the process backend's persisted file).
func (w *Worker) Publish() { w.publish() }
