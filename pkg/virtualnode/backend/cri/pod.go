package cri

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/volume"
)

// podRun is one pod on the runtime: its sandbox and volumes, and the
// runtime containers podruntime's worker asks for (it implements
// podruntime.Runner).
type podRun struct {
	b   *Backend
	w   *podruntime.Worker
	pod *corev1.Pod // as admitted; the worker has its status

	mu        sync.Mutex
	sandboxID string
	sandbox   *runtimeapi.PodSandboxConfig
	// sandboxNext is when a sandbox that failed to be created is tried
	// again.
	sandboxNext time.Time
	podIP       string
	vols        *volume.Manager // the worker goroutine's only
}

func newPodRun(b *Backend, pod *corev1.Pod) *podRun {
	pr := &podRun{b: b, pod: pod}
	pr.sandbox = pr.sandboxConfig()
	pr.vols = volume.New(pod, volume.Config{
		Dir: pr.podDir(), Source: b.cfg.Volumes, NodeAllocatable: b.cfg.NodeAllocatable,
		DiskBacked: b.cfg.DiskBackedVolumes, Resync: b.cfg.VolumeResync, Logger: b.log,
		Event: pr.podEvent,
	})
	pr.w = podruntime.NewWorker(pod, pr, podruntime.WorkerConfig{
		NodeIP: b.cfg.NodeIP, BackoffInitial: b.cfg.BackoffInitial, PollInterval: b.cfg.PollInterval,
		Notify: b.cfg.Notify, Event: b.cfg.Event, Logger: b.log, ProbeTicker: b.cfg.probeTicker,
	})
	return pr
}

func (pr *podRun) logDir() string { return podLogDir(pr.b.cfg.LogDir, pr.pod) }

// Pod implements podruntime.Run.
func (pr *podRun) Pod() *corev1.Pod { return pr.pod }

// Snapshot implements podruntime.Run.
func (pr *podRun) Snapshot() *corev1.Pod { return pr.w.Snapshot() }

func (pr *podRun) key() string { return pr.pod.Namespace + "/" + pr.pod.Name }

// Prepare implements podruntime.Runner: the volumes, then the sandbox.
func (pr *podRun) Prepare(ctx context.Context) (bool, error) {
	pr.mu.Lock()
	hasSandbox := pr.sandboxID != ""
	pr.mu.Unlock()
	if !pr.vols.Sync(ctx) && !hasSandbox {
		return false, nil
	}
	if hasSandbox {
		return true, nil
	}
	if time.Now().Before(pr.sandboxNext) {
		return false, nil
	}
	return pr.runSandbox(ctx)
}

// runSandbox creates the pod's sandbox. On failure, as the kubelet: a
// FailedCreatePodSandBox event, the pod stays Pending with its containers
// waiting (ContainerCreating, the error as message), and the sandbox is
// tried again after the back-off (the kubelet's pod worker requeues a
// pod whose sync failed after backOffPeriod, 10s).
func (pr *podRun) runSandbox(ctx context.Context) (bool, error) {
	id, err := pr.createSandbox(ctx)
	if err != nil {
		pr.b.log.Warn("Creating a pod sandbox", "pod", pr.key(), "err", err)
		pr.sandboxNext = time.Now().Add(pr.b.cfg.BackoffInitial)
		if pr.b.cfg.Event != nil {
			pr.b.cfg.Event(pr.pod, "", corev1.EventTypeWarning, podruntime.EventFailedCreatePodSandBox, podruntime.CreatePodSandboxMessage(err.Error()))
		}
		return false, errors.New(podruntime.CreatePodSandboxMessage(status.Convert(err).Message()))
	}
	pr.mu.Lock()
	pr.sandboxID = id
	pr.mu.Unlock()
	pr.readPodIP(ctx)
	return true, nil
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

// PodIP implements podruntime.Runner.
func (pr *podRun) PodIP() string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.podIP
}

// ContainerID implements podruntime.Runner.
func (pr *podRun) ContainerID(id string) string { return pr.b.containerID(id) }

// Observe implements podruntime.Runner through ContainerStatus; an exited
// container's termination message is read as the kubelet reads it.
func (pr *podRun) Observe(ctx context.Context, c *corev1.Container, id string) (podruntime.Observed, error) {
	resp, err := pr.b.rt.ContainerStatus(pr.b.logctx(ctx), id, false)
	if status.Code(err) == codes.NotFound {
		return podruntime.Observed{}, fmt.Errorf("container %s: %w", id, podruntime.ErrContainerGone)
	}
	if err != nil {
		return podruntime.Observed{}, err
	}
	s := resp.Status
	if s == nil {
		return podruntime.Observed{}, fmt.Errorf("container %s: the runtime gave no status", id)
	}
	o := podruntime.Observed{ImageID: s.ImageRef}
	switch s.State {
	case runtimeapi.ContainerState_CONTAINER_RUNNING:
		o.Running, o.StartedAt = true, time.Unix(0, s.StartedAt)
	case runtimeapi.ContainerState_CONTAINER_EXITED, runtimeapi.ContainerState_CONTAINER_UNKNOWN:
		var msg string
		if s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			msg = terminationMessage(c, s, pr.containerDir(c.Name))
		}
		o.Terminated = podruntime.WithTerminationMessage(terminated(s, pr.b.containerID(id)), msg)
	}
	return o, nil
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

// Start implements podruntime.Runner: the image as the pull policy says,
// the container's configuration, PreStartContainer, then CreateContainer
// and StartContainer.
func (pr *podRun) Start(ctx context.Context, c *corev1.Container, attempt int32) (podruntime.Started, error) {
	imageRef, err := pr.ensureImage(ctx, c)
	if err != nil {
		return podruntime.Started{}, err
	}
	cfg, err := pr.containerConfig(ctx, c, uint32(attempt), imageRef) //nolint:gosec // restart counts are small
	if err != nil {
		return podruntime.Started{}, &podruntime.WaitError{Reason: podruntime.ReasonCreateContainerConfigError, Message: err.Error()}
	}
	if pr.b.cfg.PreStart != nil {
		if err := pr.b.cfg.PreStart(ctx, pr.pod, c.Name); err != nil {
			pr.removeTerminationFiles(cfg.Mounts)
			return podruntime.Started{}, &podruntime.WaitError{Reason: podruntime.ReasonCreateContainerConfigError, Message: "PreStartContainer: " + err.Error()}
		}
	}
	pr.mu.Lock()
	sandboxID := pr.sandboxID
	pr.mu.Unlock()
	id, err := pr.b.rt.CreateContainer(pr.b.logctx(ctx), sandboxID, cfg, pr.sandbox)
	if err != nil {
		pr.removeTerminationFiles(cfg.Mounts)
		return podruntime.Started{}, &podruntime.WaitError{Reason: podruntime.ReasonCreateContainerError, Message: status.Convert(err).Message()}
	}
	if err := pr.b.rt.StartContainer(pr.b.logctx(ctx), id); err != nil {
		return podruntime.Started{ID: id}, &podruntime.WaitError{Reason: podruntime.ReasonRunContainerError, Message: status.Convert(err).Message()}
	}
	return podruntime.Started{ID: id, ImageID: imageRef}, nil
}

// Stop implements podruntime.Runner through StopContainer.
func (pr *podRun) Stop(ctx context.Context, id string, grace int64) {
	err := pr.b.rt.StopContainer(pr.b.logctx(ctx), id, grace)
	if err != nil && status.Code(err) != codes.NotFound {
		pr.b.log.Warn("Stopping a container", "pod", pr.key(), "container", id, "err", err)
	}
}

// Remove implements podruntime.Runner: a dead container and its
// termination message file. The kubelet makes that file per run and
// leaves it until the pod goes, so a crash-looping container adds one
// file (of any size it wrote) a restart; here the file goes with its
// container, and a pod keeps at most the current and the previous run's.
func (pr *podRun) Remove(ctx context.Context, id string) {
	if resp, err := pr.b.rt.ContainerStatus(pr.b.logctx(ctx), id, false); err == nil && resp.Status != nil {
		pr.removeTerminationFiles(resp.Status.Mounts)
	}
	if err := pr.b.rt.RemoveContainer(pr.b.logctx(ctx), id); err != nil && status.Code(err) != codes.NotFound {
		pr.b.log.Warn("Removing a container", "pod", pr.key(), "container", id, "err", err)
	}
}

// Ended implements podruntime.Runner: as the kubelet, a pod that ended
// has its sandbox stopped; its containers stay, for their logs, until it
// is deleted.
func (pr *podRun) Ended(ctx context.Context) {
	pr.mu.Lock()
	id := pr.sandboxID
	pr.mu.Unlock()
	if id == "" {
		return
	}
	if err := pr.b.rt.StopPodSandbox(pr.b.logctx(ctx), id); err != nil {
		pr.b.log.Warn("Stopping the sandbox of an ended pod", "pod", pr.key(), "err", err)
	}
}

// Teardown implements podruntime.Runner: the sandbox, then the pod's
// cgroup.
func (pr *podRun) Teardown(ctx context.Context) {
	pr.mu.Lock()
	id := pr.sandboxID
	pr.mu.Unlock()
	if id != "" {
		pr.b.removeSandbox(ctx, id)
	}
	pr.b.removePodCgroup(pr.pod)
}

// ensureImage returns the image to run, pulling it as the container's
// pull policy says.
func (pr *podRun) ensureImage(ctx context.Context, c *corev1.Container) (string, error) {
	image := c.Image
	spec := &runtimeapi.ImageSpec{Image: withDefaultTag(image)}
	st, err := pr.b.img.ImageStatus(pr.b.logctx(ctx), spec, false)
	if err != nil {
		return "", &podruntime.WaitError{Reason: podruntime.ReasonErrImageInspect, Message: podruntime.ImageInspectMessage(image, status.Convert(err).Message())}
	}
	present := st.Image != nil
	switch policy(*c) {
	case corev1.PullNever:
		if !present {
			return "", &podruntime.WaitError{Reason: podruntime.ReasonErrImageNeverPull, Message: podruntime.ImageNeverPullMessage(image)}
		}
		return st.Image.Id, nil
	case corev1.PullIfNotPresent:
		if present {
			return st.Image.Id, nil
		}
	}
	ref, err := pr.b.img.PullImage(pr.b.logctx(ctx), spec, nil, pr.sandbox)
	if err != nil {
		return "", &podruntime.WaitError{Reason: podruntime.ReasonErrImagePull, Message: status.Convert(err).Message()}
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

// adoptContainers finds the containers of an adopted sandbox: per
// container name the newest is current, the one before it previous.
func (pr *podRun) adoptContainers(ctx context.Context) error {
	ctrs, err := pr.b.rt.ListContainers(pr.b.logctx(ctx), &runtimeapi.ContainerFilter{PodSandboxId: pr.sandboxID})
	if err != nil {
		return fmt.Errorf("cri backend: listing the containers of sandbox %s: %w", pr.sandboxID, err)
	}
	for _, c := range pr.w.Containers() {
		var cur, prev *runtimeapi.Container
		for _, rc := range ctrs {
			if rc.Labels[LabelContainer] != c.Name || rc.Metadata == nil {
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
		a := podruntime.Adopted{ID: cur.Id, Restarts: int32(cur.Metadata.Attempt), StartedAt: time.Unix(0, cur.CreatedAt)} //nolint:gosec // restart counts are small
		if prev != nil {
			a.PrevID = prev.Id
		}
		pr.w.Adopt(c.Name, a)
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

// podDir is the pod's directory, as the kubelet's pods/<uid>.
func (pr *podRun) podDir() string { return filepath.Join(pr.b.cfg.PodDir, string(pr.pod.UID)) }

// mounts are the container's mounts of the pod's volumes, for the
// runtime.
func (pr *podRun) mounts(spec *corev1.Container, vars map[string]string) ([]*runtimeapi.Mount, error) {
	ms, err := pr.vols.Mounts(spec, vars)
	if err != nil {
		return nil, err
	}
	out := make([]*runtimeapi.Mount, 0, len(ms))
	for _, m := range ms {
		prop := runtimeapi.MountPropagation_PROPAGATION_PRIVATE
		switch m.Propagation {
		case corev1.MountPropagationHostToContainer:
			prop = runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER
		case corev1.MountPropagationBidirectional:
			prop = runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL
		}
		out = append(out, &runtimeapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly, Propagation: prop})
	}
	return out, nil
}

// podEvent records an event about the pod itself.
func (pr *podRun) podEvent(eventType, reason, message string) {
	if pr.b.cfg.Event != nil {
		pr.b.cfg.Event(pr.pod, "", eventType, reason, message)
	}
}

// UnmountPods unmounts what the pods under podDir (a Backend's
// Config.PodDir) left mounted: their memory-backed volumes and subPath
// bind mounts. A Backend that closes leaves them, as a kubelet that stops
// does, for the next Backend on the same directory to adopt the pods;
// UnmountPods is for when no node will (a node taken out of service, a
// test ending). Call it only when no Backend runs on podDir; the running
// containers keep their own mounts.
func UnmountPods(podDir string) error { return volume.UnmountPods(podDir) }

// Worker implements podruntime.WorkerRun.
func (pr *podRun) Worker() *podruntime.Worker { return pr.w }
