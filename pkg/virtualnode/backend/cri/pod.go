package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// ctr is one container of the pod spec and the runtime container that
// currently runs it.
type ctr struct {
	spec    corev1.Container
	init    bool
	sidecar bool

	id       string // the runtime's container, "" before the first start
	prevID   string // the one before, kept for previous logs
	exited   bool
	restarts int32
	started  time.Time // when the current one started

	state     corev1.ContainerState
	lastState corev1.ContainerState
	imageID   string

	backoff    podruntime.Backoff
	next       time.Time // no start before
	pullFailed string    // the last image pull error, while backing off

	probe probeState // what its probes found (probe.go)
}

// podRun runs one pod: its sandbox, then its containers.
type podRun struct {
	b *Backend

	mu        sync.Mutex
	pod       *corev1.Pod // status included
	sandboxID string
	sandbox   *runtimeapi.PodSandboxConfig
	// sandboxNext is when a sandbox that failed to be created is tried
	// again.
	sandboxNext time.Time
	podIP       string
	ctrs        []*ctr
	// readiness are the readiness probe workers by container name.
	readiness map[string]*podruntime.ProbeWorker
	stopping  bool
	grace     time.Duration
	ended     bool // the pod reached a terminal phase
	last      *corev1.PodStatus
	vols      podVolumes // the run goroutine's only

	stopCh   chan struct{}
	stopOnce sync.Once
	done     chan struct{}
}

func newPodRun(b *Backend, pod *corev1.Pod) *podRun {
	pr := &podRun{b: b, pod: pod, stopCh: make(chan struct{}), done: make(chan struct{})}
	for _, c := range pod.Spec.InitContainers {
		pr.ctrs = append(pr.ctrs, &ctr{spec: c, init: true, sidecar: podspec.IsSidecar(&c), backoff: pr.newBackoff()})
	}
	for _, c := range pod.Spec.Containers {
		pr.ctrs = append(pr.ctrs, &ctr{spec: c, backoff: pr.newBackoff()})
	}
	init, app := podruntime.WaitingStatuses(pod)
	for i, c := range pr.ctrs {
		if i < len(init) {
			c.state = init[i].State
		} else {
			c.state = app[i-len(init)].State
		}
	}
	pr.sandbox = pr.sandboxConfig()
	return pr
}

// newBackoff is a container's restart back-off: from BackoffInitial up to
// the kubelet's 5 minutes.
func (pr *podRun) newBackoff() podruntime.Backoff {
	return podruntime.Backoff{Initial: pr.b.cfg.BackoffInitial, Max: podruntime.DefaultBackoffMax}
}

func (pr *podRun) logDir() string { return podLogDir(pr.b.cfg.LogDir, pr.pod) }

func (pr *podRun) stop(grace time.Duration) {
	pr.mu.Lock()
	if !pr.stopping || grace < pr.grace {
		pr.grace = grace
	}
	pr.stopping = true
	pr.mu.Unlock()
	pr.stopOnce.Do(func() { close(pr.stopCh) })
}

// Pod implements podruntime.Run.
func (pr *podRun) Pod() *corev1.Pod { return pr.pod }

// Snapshot implements podruntime.Run.
func (pr *podRun) Snapshot() *corev1.Pod {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	p := pr.pod.DeepCopy()
	p.Status = *pr.statusLocked()
	return p
}

// statusLocked computes the pod status from the containers' states.
func (pr *podRun) statusLocked() *corev1.PodStatus {
	st := pr.pod.Status.DeepCopy()
	st.InitContainerStatuses, st.ContainerStatuses = nil, nil
	for _, c := range pr.ctrs {
		cs := corev1.ContainerStatus{
			Name: c.spec.Name, Image: c.spec.Image, ImageID: c.imageID,
			ContainerID: pr.b.containerID(c.id), RestartCount: c.restarts,
			State: c.state, LastTerminationState: c.lastState,
		}
		if c.init {
			st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
		} else {
			st.ContainerStatuses = append(st.ContainerStatuses, cs)
		}
	}
	podruntime.ComputeProbedStatus(pr.pod, st, pr.b.cfg.NodeIP, pr.stopping, pr.probedLocked)
	if pr.podIP != "" {
		st.PodIP = pr.podIP
		st.PodIPs = []corev1.PodIP{{IP: pr.podIP}}
	}
	pr.pod.Status.StartTime = st.StartTime
	pr.pod.Status.Conditions = st.Conditions
	return st
}

// publish reports the pod's status when it changed.
func (pr *podRun) publish() {
	pr.mu.Lock()
	st := pr.statusLocked()
	if pr.last != nil && equality.Semantic.DeepEqual(pr.last, st) {
		pr.mu.Unlock()
		return
	}
	pr.last = st.DeepCopy()
	p := pr.pod.DeepCopy()
	p.Status = *st
	pr.mu.Unlock()
	if pr.b.cfg.Notify != nil {
		pr.b.cfg.Notify(p)
	}
}

func (pr *podRun) phase() corev1.PodPhase {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.statusLocked().Phase
}

// run creates the sandbox, then starts, follows and restarts the
// containers until the pod is deleted.
func (pr *podRun) run(ctx context.Context) {
	defer pr.startProbes(ctx)()
	t := time.NewTicker(pr.b.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-pr.stopCh:
			pr.terminate(ctx)
			return
		case <-ctx.Done():
			return
		default:
		}
		pr.sync(ctx)
		pr.publish()
		if ph := pr.phase(); !pr.ended && (ph == corev1.PodSucceeded || ph == corev1.PodFailed) {
			// As the kubelet: a pod that ended has its sandbox stopped;
			// its containers stay, for their logs, until it is deleted.
			pr.ended = true
			if pr.sandboxID != "" {
				if err := pr.b.rt.StopPodSandbox(pr.b.logctx(ctx), pr.sandboxID); err != nil {
					pr.b.log.Warn("Stopping the sandbox of an ended pod", "pod", pr.key(), "err", err)
				}
			}
		}
		if pr.ended {
			select {
			case <-pr.stopCh:
			case <-ctx.Done():
			}
			continue
		}
		select {
		case <-pr.stopCh:
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

func (pr *podRun) key() string { return pr.pod.Namespace + "/" + pr.pod.Name }

// sync does one round: the sandbox when there is none, the containers'
// states, then what should start.
func (pr *podRun) sync(ctx context.Context) {
	if !pr.syncVolumes(ctx) && pr.sandboxID == "" {
		return
	}
	if pr.sandboxID == "" {
		if time.Now().Before(pr.sandboxNext) {
			return
		}
		if !pr.runSandbox(ctx) {
			return
		}
	}
	pr.refresh(ctx)
	now := time.Now()
	for _, c := range pr.ctrs {
		if !c.init {
			continue
		}
		if c.sidecar {
			pr.ensure(ctx, c, now)
			if c.id == "" || c.exited || !pr.started(c) {
				return // the next waits for the sidecar to have started
			}
			continue
		}
		if c.exited && c.state.Terminated != nil && c.state.Terminated.ExitCode == 0 {
			continue
		}
		pr.ensure(ctx, c, now)
		return
	}
	for _, c := range pr.ctrs {
		if !c.init {
			pr.ensure(ctx, c, now)
		}
	}
}

// runSandbox creates the pod's sandbox. On failure, as the kubelet: a
// FailedCreatePodSandBox event, the pod stays Pending with its containers
// waiting (ContainerCreating, the error as message), and the sandbox is
// tried again after the back-off (the kubelet's pod worker requeues a
// pod whose sync failed after backOffPeriod, 10s).
func (pr *podRun) runSandbox(ctx context.Context) bool {
	id, err := pr.createSandbox(ctx)
	if err != nil {
		msg := podruntime.CreatePodSandboxMessage(status.Convert(err).Message())
		pr.b.log.Warn("Creating a pod sandbox", "pod", pr.key(), "err", err)
		pr.mu.Lock()
		pr.sandboxNext = time.Now().Add(pr.b.cfg.BackoffInitial)
		for _, c := range pr.ctrs {
			if c.state.Waiting != nil {
				// A new state: the one before went out with a notification.
				c.state = waiting(c.state.Waiting.Reason, msg)
			}
		}
		pr.mu.Unlock()
		if pr.b.cfg.Event != nil {
			pr.b.cfg.Event(pr.pod, "", corev1.EventTypeWarning, podruntime.EventFailedCreatePodSandBox, podruntime.CreatePodSandboxMessage(err.Error()))
		}
		return false
	}
	pr.mu.Lock()
	pr.sandboxID = id
	pr.mu.Unlock()
	pr.readPodIP(ctx)
	return true
}

func (pr *podRun) readPodIP(ctx context.Context) {
	if pr.pod.Spec.HostNetwork {
		return
	}
	st, err := pr.b.rt.PodSandboxStatus(pr.b.logctx(ctx), pr.sandboxID, false)
	if err != nil || st.Status == nil || st.Status.Network == nil {
		return
	}
	pr.mu.Lock()
	pr.podIP = st.Status.Network.Ip
	pr.mu.Unlock()
}

// refresh reads the state of every container from the runtime.
func (pr *podRun) refresh(ctx context.Context) {
	for _, c := range pr.ctrs {
		if c.id == "" || c.exited {
			continue
		}
		resp, err := pr.b.rt.ContainerStatus(pr.b.logctx(ctx), c.id, false)
		if status.Code(err) == codes.NotFound {
			pr.mu.Lock()
			pr.exit(c, unknownTermination(c))
			pr.mu.Unlock()
			continue
		}
		if err != nil || resp.Status == nil {
			pr.b.log.Warn("Reading a container's status", "pod", pr.key(), "container", c.spec.Name, "err", err)
			continue
		}
		s := resp.Status
		var msg string
		if s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			msg = terminationMessage(&c.spec, s, pr.containerDir(c.spec.Name))
		}
		pr.mu.Lock()
		if s.ImageRef != "" {
			c.imageID = s.ImageRef
		}
		switch s.State {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: nsTime(s.StartedAt)}}
		case runtimeapi.ContainerState_CONTAINER_EXITED, runtimeapi.ContainerState_CONTAINER_UNKNOWN:
			pr.exit(c, podruntime.WithTerminationMessage(terminated(s, pr.b.containerID(c.id)), msg))
		}
		pr.mu.Unlock()
	}
}

// exit records that c's current container ended, and when it may start
// again.
func (pr *podRun) exit(c *ctr, t *corev1.ContainerStateTerminated) {
	c.exited = true
	c.state = corev1.ContainerState{Terminated: t}
	if !c.started.IsZero() {
		c.backoff.Ran(time.Since(c.started))
	}
	c.next = t.FinishedAt.Add(c.backoff.Delay())
}

func unknownTermination(c *ctr) *corev1.ContainerStateTerminated {
	now := podruntime.Now()
	return &corev1.ContainerStateTerminated{
		ExitCode: 137, Reason: podruntime.ReasonContainerStatusUnknown,
		Message:   podruntime.MessageContainerStatusUnknown,
		StartedAt: metav1.NewTime(c.started), FinishedAt: now,
	}
}

func terminated(s *runtimeapi.ContainerStatus, id string) *corev1.ContainerStateTerminated {
	reason := s.Reason
	if reason == "" {
		reason = podruntime.ExitReason(s.ExitCode)
	}
	return &corev1.ContainerStateTerminated{
		ExitCode: s.ExitCode, Reason: reason, Message: s.Message,
		StartedAt: nsTime(s.StartedAt), FinishedAt: nsTime(s.FinishedAt), ContainerID: id,
	}
}

func nsTime(ns int64) metav1.Time {
	if ns == 0 {
		return metav1.Time{}
	}
	return metav1.NewTime(time.Unix(0, ns).Truncate(time.Second))
}

// shouldRestart applies the restart policy to an exited container.
func (pr *podRun) shouldRestart(c *ctr) bool {
	code := int32(0)
	if c.state.Terminated != nil {
		code = c.state.Terminated.ExitCode
	}
	return podruntime.ShouldRestart(pr.pod, &c.spec, c.init, code)
}

// ensure starts c when it has not run yet or should run again and its
// back-off has passed, and reports the waiting reason otherwise.
func (pr *podRun) ensure(ctx context.Context, c *ctr, now time.Time) {
	if c.id != "" && !c.exited {
		return
	}
	if c.exited && !pr.shouldRestart(c) {
		return
	}
	if now.Before(c.next) {
		pr.mu.Lock()
		switch {
		case c.exited:
			if c.state.Terminated != nil {
				c.lastState = c.state
			}
			c.state = waiting(podruntime.ReasonCrashLoopBackOff, podruntime.CrashLoopBackOffMessage(c.backoff.Delay(), pr.pod, c.spec.Name))
		case c.pullFailed != "":
			c.state = waiting(podruntime.ReasonImagePullBackOff, podruntime.ImagePullBackOffMessage(c.spec.Image, c.pullFailed))
		}
		pr.mu.Unlock()
		return
	}
	if err := pr.start(ctx, c); err != nil {
		pr.mu.Lock()
		var we *waitError
		if errors.As(err, &we) {
			c.state = waiting(we.reason, we.message)
		} else {
			c.state = waiting(podruntime.ReasonRunContainerError, err.Error())
		}
		c.next = now.Add(c.backoff.Delay())
		c.backoff.Step()
		pr.mu.Unlock()
		pr.b.log.Warn("Starting a container", "pod", pr.key(), "container", c.spec.Name, "err", err)
	}
}

// waitError is a start failure reported as a Waiting reason.
type waitError struct{ reason, message string }

func (e *waitError) Error() string { return e.reason + ": " + e.message }

func waiting(reason, message string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}}
}

// start creates and starts one run of c.
func (pr *podRun) start(ctx context.Context, c *ctr) error {
	restart := c.id != ""
	attempt := c.restarts
	if restart {
		attempt++
	}
	imageRef, err := pr.ensureImage(ctx, c)
	if err != nil {
		return err
	}
	cfg, err := pr.containerConfig(ctx, c, uint32(attempt), imageRef) //nolint:gosec // restart counts are small
	if err != nil {
		return &waitError{podruntime.ReasonCreateContainerConfigError, err.Error()}
	}
	if pr.b.cfg.PreStart != nil {
		if err := pr.b.cfg.PreStart(ctx, pr.pod, c.spec.Name); err != nil {
			pr.removeTerminationFiles(cfg.Mounts)
			return &waitError{podruntime.ReasonCreateContainerConfigError, "PreStartContainer: " + err.Error()}
		}
	}
	id, err := pr.b.rt.CreateContainer(pr.b.logctx(ctx), pr.sandboxID, cfg, pr.sandbox)
	if err != nil {
		pr.removeTerminationFiles(cfg.Mounts)
		return &waitError{podruntime.ReasonCreateContainerError, status.Convert(err).Message()}
	}
	if err := pr.b.rt.StartContainer(pr.b.logctx(ctx), id); err != nil {
		pr.mu.Lock()
		c.prevID, c.id, c.exited, c.started = c.id, id, false, time.Now()
		pr.mu.Unlock()
		return &waitError{podruntime.ReasonRunContainerError, status.Convert(err).Message()}
	}
	// Only the last dead container is kept (for previous logs), as the
	// kubelet's garbage collector keeps one per container by default.
	if c.prevID != "" {
		pr.removeContainer(ctx, c.prevID)
	}
	pr.mu.Lock()
	if restart {
		c.restarts = attempt
		c.lastState = corev1.ContainerState{Terminated: c.lastTerminated()}
		c.backoff.Step()
	}
	c.prevID, c.id, c.exited, c.started = c.id, id, false, time.Now()
	c.pullFailed, c.imageID = "", imageRef
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: podruntime.Now()}}
	pr.mu.Unlock()
	pr.postStart(ctx, c)
	return nil
}

func (c *ctr) lastTerminated() *corev1.ContainerStateTerminated {
	if c.state.Terminated != nil {
		return c.state.Terminated
	}
	return c.lastState.Terminated
}

// removeContainer removes a dead container and its termination message
// file. The kubelet makes that file per run and leaves it until the pod
// goes, so a crash-looping container adds one file (of any size it
// wrote) a restart; here the file goes with its container, and a pod
// keeps at most the current and the previous run's.
func (pr *podRun) removeContainer(ctx context.Context, id string) {
	if resp, err := pr.b.rt.ContainerStatus(pr.b.logctx(ctx), id, false); err == nil && resp.Status != nil {
		pr.removeTerminationFiles(resp.Status.Mounts)
	}
	if err := pr.b.rt.RemoveContainer(pr.b.logctx(ctx), id); err != nil && status.Code(err) != codes.NotFound {
		pr.b.log.Warn("Removing a container", "pod", pr.key(), "container", id, "err", err)
	}
}

// ensureImage returns the image to run, pulling it as the container's
// pull policy says.
func (pr *podRun) ensureImage(ctx context.Context, c *ctr) (string, error) {
	image := c.spec.Image
	spec := &runtimeapi.ImageSpec{Image: withDefaultTag(image)}
	st, err := pr.b.img.ImageStatus(pr.b.logctx(ctx), spec, false)
	if err != nil {
		return "", &waitError{podruntime.ReasonErrImageInspect, podruntime.ImageInspectMessage(image, status.Convert(err).Message())}
	}
	present := st.Image != nil
	switch policy(c.spec) {
	case corev1.PullNever:
		if !present {
			return "", &waitError{podruntime.ReasonErrImageNeverPull, podruntime.ImageNeverPullMessage(image)}
		}
		return st.Image.Id, nil
	case corev1.PullIfNotPresent:
		if present {
			return st.Image.Id, nil
		}
	}
	ref, err := pr.b.img.PullImage(pr.b.logctx(ctx), spec, nil, pr.sandbox)
	if err != nil {
		msg := status.Convert(err).Message()
		pr.mu.Lock()
		c.pullFailed = msg
		pr.mu.Unlock()
		return "", &waitError{podruntime.ReasonErrImagePull, msg}
	}
	return ref, nil
}

// withDefaultTag is image with the tag "latest" when it names neither a
// tag nor a digest, what the kubelet's applyDefaultImageTag
// (pkg/kubelet/images) asks the runtime to inspect and pull: "foo" as
// "foo:latest", "registry:5000/foo" as "registry:5000/foo:latest". Like
// the kubelet it does not qualify the name (docker.io/library/...): that
// is the runtime's.
func withDefaultTag(image string) string {
	for i := len(image) - 1; i >= 0; i-- {
		switch image[i] {
		case '@', ':':
			return image
		case '/':
			return image + ":latest"
		}
	}
	return image + ":latest"
}

// policy is the container's image pull policy, defaulted as the API
// server does.
func policy(c corev1.Container) corev1.PullPolicy {
	if c.ImagePullPolicy != "" {
		return c.ImagePullPolicy
	}
	if tagLatest(c.Image) {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

func tagLatest(image string) bool {
	for i := len(image) - 1; i >= 0; i-- {
		switch image[i] {
		case '@':
			return false
		case ':':
			return image[i+1:] == "latest"
		case '/':
			return true
		}
	}
	return true
}

// terminate stops every container with the grace period, then the
// sandbox, and removes them; containers that never ran are reported as
// the kubelet reports them.
func (pr *podRun) terminate(ctx context.Context) {
	pr.mu.Lock()
	grace := pr.grace
	pr.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range pr.ctrs {
		if c.id == "" || c.exited {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pr.killContainer(ctx, c, c.id, "", int64(grace/time.Second))
		}()
	}
	wg.Wait()
	pr.refresh(ctx)
	pr.mu.Lock()
	for _, c := range pr.ctrs {
		if c.state.Terminated == nil {
			if c.state.Waiting != nil && c.lastState.Terminated != nil {
				c.state = corev1.ContainerState{Terminated: c.lastState.Terminated}
				continue
			}
			c.state = corev1.ContainerState{Terminated: unknownTermination(c)}
		}
	}
	id := pr.sandboxID
	pr.mu.Unlock()
	if id != "" {
		pr.b.removeSandbox(ctx, id)
	}
	pr.b.removePodCgroup(pr.pod)
	pr.publish()
}

// adoptContainers finds the containers of an adopted sandbox: per
// container name the newest is current, the one before it previous.
func (pr *podRun) adoptContainers(ctx context.Context) error {
	ctrs, err := pr.b.rt.ListContainers(pr.b.logctx(ctx), &runtimeapi.ContainerFilter{PodSandboxId: pr.sandboxID})
	if err != nil {
		return fmt.Errorf("cri backend: listing the containers of sandbox %s: %w", pr.sandboxID, err)
	}
	for _, c := range pr.ctrs {
		var cur, prev *runtimeapi.Container
		for _, rc := range ctrs {
			if rc.Labels[LabelContainer] != c.spec.Name || rc.Metadata == nil {
				continue
			}
			switch {
			case cur == nil || rc.Metadata.Attempt > cur.Metadata.Attempt:
				prev, cur = cur, rc
			case prev == nil || rc.Metadata.Attempt > prev.Metadata.Attempt:
				prev = rc
			}
		}
		if cur == nil {
			continue
		}
		c.id, c.restarts = cur.Id, int32(cur.Metadata.Attempt) //nolint:gosec // restart counts are small
		c.started = time.Unix(0, cur.CreatedAt)
		if prev != nil {
			c.prevID = prev.Id
		}
		c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: nsTime(cur.CreatedAt)}}
	}
	pr.readPodIP(ctx)
	return nil
}

// podAnnotation is the pod as kept on its sandbox for adoption: no
// status, no managed fields.
func podAnnotation(pod *corev1.Pod) string {
	p := pod.DeepCopy()
	p.Status = corev1.PodStatus{}
	p.ManagedFields = nil
	b, err := json.Marshal(p)
	if err != nil {
		return ""
	}
	return string(b)
}
