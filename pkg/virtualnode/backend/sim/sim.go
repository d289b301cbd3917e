// Package sim is the virtual node backend that runs nothing: pods move
// through their phases on configured timings, like kwok's stages, for
// scale tests of scheduling and device accounting.
package sim

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Config configures the sim backend.
type Config struct {
	backend.Config
	// StartDelay is how long a pod stays Pending (ContainerCreating)
	// before its containers run. Zero starts them at once.
	StartDelay time.Duration
	// RunDuration is how long containers run before they exit 0; zero
	// runs them until the pod is deleted. Pods with restartPolicy Always
	// run until deleted regardless.
	RunDuration time.Duration
}

// Backend is the sim backend.
type Backend struct {
	cfg Config

	mu     sync.Mutex
	pods   map[types.UID]*simPod
	closed bool
}

type simPod struct {
	pod    *corev1.Pod
	timers []*time.Timer
	// ctx bounds the pod's PreStart calls; cancel ends it when the pod
	// is deleted or forgotten, or the backend closes.
	ctx    context.Context
	cancel context.CancelFunc
}

// New returns a sim backend.
func New(cfg Config) *Backend {
	if cfg.Notify == nil {
		cfg.Notify = func(*corev1.Pod) {}
	}
	return &Backend{cfg: cfg, pods: map[types.UID]*simPod{}}
}

// CreatePod implements backend.Backend.
func (b *Backend) CreatePod(_ context.Context, pod *corev1.Pod) error {
	b.mu.Lock()
	if _, ok := b.pods[pod.UID]; ok || b.closed {
		b.mu.Unlock()
		return nil
	}
	sp := &simPod{pod: pod.DeepCopy()}
	sp.ctx, sp.cancel = context.WithCancel(context.Background())
	sp.pod.Status.InitContainerStatuses, sp.pod.Status.ContainerStatuses = podruntime.WaitingStatuses(sp.pod)
	b.pods[pod.UID] = sp
	if b.cfg.StartDelay <= 0 {
		b.mu.Unlock()
		// Nothing to wait for: the pod is reported once, as it runs
		// (one status write per pod, not two).
		b.run(pod.UID)
		return nil
	}
	out := b.publishLocked(sp, false)
	sp.timers = append(sp.timers, time.AfterFunc(b.cfg.StartDelay, func() { b.run(pod.UID) }))
	b.mu.Unlock()
	b.cfg.Notify(out)
	return nil
}

// run starts the pod's containers: init containers complete in order
// (restartable ones, sidecars, keep running) and app containers run. Each
// start is preceded by Config.PreStart, as the kubelet calls the device
// plugins' PreStartContainer while preparing each container; a container
// whose PreStart fails stays Waiting with CreateContainerConfigError (the
// sim backend does not retry), and a failed init container holds back the
// containers after it.
func (b *Backend) run(uid types.UID) {
	b.mu.Lock()
	sp, ok := b.pods[uid]
	if !ok || b.closed || sp.pod.DeletionTimestamp != nil {
		b.mu.Unlock()
		return
	}
	pod, ctx := sp.pod.DeepCopy(), sp.ctx
	b.mu.Unlock()

	failed := map[string]error{}
	blocked := false // a plain init container failed its PreStart
	preStart := func(name string) bool {
		if b.cfg.PreStart == nil || blocked {
			return !blocked
		}
		if err := b.cfg.PreStart(ctx, pod, name); err != nil {
			failed[name] = err
			return false
		}
		return true
	}
	for _, c := range pod.Spec.InitContainers {
		if !preStart(c.Name) && !podspec.IsSidecar(&c) {
			blocked = true
		}
	}
	for _, c := range pod.Spec.Containers {
		preStart(c.Name)
	}

	b.mu.Lock()
	if cur, ok := b.pods[uid]; !ok || cur != sp || b.closed || sp.pod.DeletionTimestamp != nil {
		b.mu.Unlock()
		return
	}
	now := podruntime.Now()
	start := func(s *corev1.ContainerStatus, state corev1.ContainerState) {
		if err, ok := failed[s.Name]; ok {
			s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: podruntime.ReasonCreateContainerConfigError, Message: err.Error()}}
			return
		}
		s.State = state
	}
	held := false
	for i, c := range sp.pod.Spec.InitContainers {
		s := &sp.pod.Status.InitContainerStatuses[i]
		switch {
		case held:
		case podspec.IsSidecar(&c):
			start(s, corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}})
		default:
			start(s, podruntime.Terminated(0, podruntime.ReasonCompleted, "", now, now))
			held = failed[c.Name] != nil
		}
	}
	for i := range sp.pod.Status.ContainerStatuses {
		if held {
			break
		}
		start(&sp.pod.Status.ContainerStatuses[i], corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}})
	}
	out := b.publishLocked(sp, false)
	if b.cfg.RunDuration > 0 && sp.pod.Spec.RestartPolicy != corev1.RestartPolicyAlways {
		sp.timers = append(sp.timers, time.AfterFunc(b.cfg.RunDuration, func() { b.finish(uid, false) }))
	}
	b.mu.Unlock()
	b.cfg.Notify(out)
}

// finish terminates every container: exit 0 when they ran their course,
// 137 when deleted.
func (b *Backend) finish(uid types.UID, deleting bool) {
	b.mu.Lock()
	sp, ok := b.pods[uid]
	if !ok || b.closed {
		b.mu.Unlock()
		return
	}
	for _, t := range sp.timers {
		t.Stop()
	}
	if deleting {
		sp.cancel()
	}
	now := podruntime.Now()
	term := func(list []corev1.ContainerStatus) {
		for i := range list {
			s := &list[i]
			switch {
			case s.State.Running != nil && deleting:
				s.State = podruntime.Terminated(137, podruntime.ReasonError, "", s.State.Running.StartedAt, now)
			case s.State.Running != nil:
				s.State = podruntime.Terminated(0, podruntime.ReasonCompleted, "", s.State.Running.StartedAt, now)
			case s.State.Waiting != nil:
				s.State = podruntime.Terminated(137, podruntime.ReasonContainerStatusUnknown, podruntime.MessageContainerStatusUnknown, now, now)
			}
		}
	}
	term(sp.pod.Status.InitContainerStatuses)
	term(sp.pod.Status.ContainerStatuses)
	out := b.publishLocked(sp, deleting)
	b.mu.Unlock()
	b.cfg.Notify(out)
}

func (b *Backend) publishLocked(sp *simPod, deleting bool) *corev1.Pod {
	podruntime.ComputeStatus(sp.pod, &sp.pod.Status, b.cfg.NodeIP, deleting)
	return sp.pod.DeepCopy()
}

// DeletePod implements backend.Backend: containers stop at once.
func (b *Backend) DeletePod(_ context.Context, pod *corev1.Pod) error {
	b.mu.Lock()
	sp, ok := b.pods[pod.UID]
	if ok {
		sp.pod.DeletionTimestamp = pod.DeletionTimestamp
	}
	b.mu.Unlock()
	if ok {
		b.finish(pod.UID, true)
	}
	return nil
}

// Forget implements backend.Backend.
func (b *Backend) Forget(_ context.Context, pod *corev1.Pod) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sp, ok := b.pods[pod.UID]; ok {
		for _, t := range sp.timers {
			t.Stop()
		}
		sp.cancel()
		delete(b.pods, pod.UID)
	}
	return nil
}

// Pods implements backend.Backend.
func (b *Backend) Pods() []*corev1.Pod {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(b.pods))
	for _, sp := range b.pods {
		out = append(out, sp.pod.DeepCopy())
	}
	backend.SortPods(out)
	return out
}

// Close stops every timer. Simulated pods do not survive a restart.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for _, sp := range b.pods {
		for _, t := range sp.timers {
			t.Stop()
		}
		sp.cancel()
	}
	return nil
}

var _ backend.Backend = (*Backend)(nil)
