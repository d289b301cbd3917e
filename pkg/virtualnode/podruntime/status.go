package podruntime

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/podspec"
)

// ComputeStatus fills the pod-level fields of st from its container
// statuses with the kubelet's rules: phase, conditions, start time and
// addresses. init and app are the statuses in spec order; an entry whose
// state is empty has not been created yet (Waiting with reason).
// deleting reports that the pod is being torn down, which makes a pod
// whose containers all stopped terminal. A running container is started
// and ready.
func ComputeStatus(pod *corev1.Pod, st *corev1.PodStatus, nodeIP string, deleting bool) {
	ComputeProbedStatus(pod, st, nodeIP, deleting, nil)
}

// Probed tells, for a running container, what its probes found: started
// once its startup probe passed (or it has none), ready while its
// readiness probe passes (or it has none).
type Probed func(container string) (started, ready bool)

// ComputeProbedStatus is ComputeStatus for a backend that probes its
// containers: a running app container or sidecar is started and ready as
// probed says (never ready before started), and the pod's
// ContainersReady and Ready conditions need every app container and
// sidecar ready, as the kubelet's (prober_manager UpdatePodStatus,
// status GenerateContainersReadyCondition). A nil probed is
// ComputeStatus.
func ComputeProbedStatus(pod *corev1.Pod, st *corev1.PodStatus, nodeIP string, deleting bool, probed Probed) {
	init, app := st.InitContainerStatuses, st.ContainerStatuses
	policy := pod.Spec.RestartPolicy
	if policy == "" {
		policy = corev1.RestartPolicyAlways
	}
	phase := corev1.PodPending
	initDone := true
	initFailed := false
	for i, c := range init {
		if isSidecar(pod, i) {
			continue
		}
		t := c.State.Terminated
		switch {
		case t != nil && t.ExitCode == 0:
		case t != nil && policy == corev1.RestartPolicyNever:
			initFailed = true
			initDone = false
		default:
			initDone = false
		}
	}
	running, terminated, succeeded := 0, 0, 0
	for _, c := range app {
		switch {
		case c.State.Running != nil:
			running++
		case c.State.Terminated != nil:
			terminated++
			if c.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case c.State.Waiting != nil && c.LastTerminationState.Terminated != nil:
			// Waiting to restart (CrashLoopBackOff): stopped, as the
			// kubelet's getPhase counts it, so the pod stays Running.
			terminated++
		}
	}
	switch {
	case initFailed:
		phase = corev1.PodFailed
	case !initDone:
		phase = corev1.PodPending
		if deleting {
			phase = corev1.PodFailed
		}
	case len(app) > 0 && terminated == len(app):
		switch {
		case succeeded == len(app) && (policy != corev1.RestartPolicyAlways || deleting):
			phase = corev1.PodSucceeded
		case policy == corev1.RestartPolicyNever || deleting:
			if succeeded == len(app) {
				phase = corev1.PodSucceeded
			} else {
				phase = corev1.PodFailed
			}
		default:
			phase = corev1.PodRunning // waiting for a restart
		}
	case running > 0 || terminated > 0:
		phase = corev1.PodRunning
	}
	st.Phase = phase
	if nodeIP != "" {
		st.HostIP = nodeIP
		st.HostIPs = []corev1.HostIP{{IP: nodeIP}}
		st.PodIP = nodeIP
		st.PodIPs = []corev1.PodIP{{IP: nodeIP}}
	}
	if st.StartTime == nil {
		t := Now()
		st.StartTime = &t
	}
	ready := phase == corev1.PodRunning && running == len(app)
	if !setReady(pod, init, app, probed) && probed != nil {
		ready = false
	}
	setConditions(st, pod.Generation, phase, initDone, ready)
}

// setReady sets the containers' started and ready: an init container is
// ready once it exited 0; an app container or a sidecar is started and
// ready while it runs, as probed says if not nil. It reports whether every
// app container and sidecar is ready.
func setReady(pod *corev1.Pod, init, app []corev1.ContainerStatus, probed Probed) bool {
	all := true
	probe := func(cs *corev1.ContainerStatus) {
		started := cs.State.Running != nil
		cs.Ready = started
		if started && probed != nil {
			var ok bool
			started, ok = probed(cs.Name)
			cs.Ready = started && ok
		}
		cs.Started = &started
		all = all && cs.Ready
	}
	for i := range app {
		probe(&app[i])
	}
	for i := range init {
		if isSidecar(pod, i) {
			probe(&init[i])
			continue
		}
		init[i].Ready = init[i].State.Terminated != nil && init[i].State.Terminated.ExitCode == 0
		started := init[i].State.Running != nil
		init[i].Started = &started
	}
	return all
}

// setConditions sets the pod's conditions with the kubelet's reasons
// (pkg/kubelet/status/generate.go): once the pod is terminal,
// ContainersReady and Ready read PodCompleted or PodFailed, and
// Initialized of a Succeeded pod PodCompleted.
func setConditions(st *corev1.PodStatus, generation int64, phase corev1.PodPhase, initDone, ready bool) {
	initReason, readyReason := "", ""
	if !initDone {
		initReason = "ContainersNotInitialized"
	}
	if !ready {
		readyReason = "ContainersNotReady"
	}
	switch phase {
	case corev1.PodSucceeded:
		initDone, initReason, readyReason = true, "PodCompleted", "PodCompleted"
	case corev1.PodFailed:
		readyReason = "PodFailed"
	}
	st.ObservedGeneration = generation
	setCondition(st, generation, corev1.PodScheduled, true, "")
	setCondition(st, generation, corev1.PodInitialized, initDone, initReason)
	setCondition(st, generation, corev1.ContainersReady, ready, readyReason)
	setCondition(st, generation, corev1.PodReady, ready, readyReason)
}

// isSidecar reports whether the i-th init container of pod is a
// sidecar.
func isSidecar(pod *corev1.Pod, i int) bool {
	return i < len(pod.Spec.InitContainers) && podspec.IsSidecar(&pod.Spec.InitContainers[i])
}

// setCondition sets a condition's status and reason, and the pod
// generation it was computed for; its transition time changes only with
// its status, as the kubelet's does.
func setCondition(st *corev1.PodStatus, generation int64, t corev1.PodConditionType, ok bool, reason string) {
	status := corev1.ConditionFalse
	if ok {
		status = corev1.ConditionTrue
	}
	for i := range st.Conditions {
		c := &st.Conditions[i]
		if c.Type != t {
			continue
		}
		if c.Status != status {
			c.Status = status
			c.LastTransitionTime = Now()
		}
		c.Reason = reason
		c.ObservedGeneration = generation
		return
	}
	st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: status, Reason: reason, ObservedGeneration: generation, LastTransitionTime: Now()})
}

// WaitingStatuses returns Waiting statuses (reason PodInitializing for
// app containers behind init containers, ContainerCreating otherwise) for
// every container of pod, in spec order.
func WaitingStatuses(pod *corev1.Pod) (init, app []corev1.ContainerStatus) {
	for _, c := range pod.Spec.InitContainers {
		init = append(init, waiting(c, ReasonPodInitializing))
	}
	reason := ReasonContainerCreating
	if len(pod.Spec.InitContainers) > 0 {
		reason = ReasonPodInitializing
	}
	for _, c := range pod.Spec.Containers {
		app = append(app, waiting(c, reason))
	}
	return init, app
}

func waiting(c corev1.Container, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{
		Name:        c.Name,
		Image:       c.Image,
		ImageID:     "",
		ContainerID: "",
		State:       corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}},
	}
}

// Now is a metav1.Time truncated to seconds, like what the API server
// stores, so repeated notifications of one state compare equal.
func Now() metav1.Time { return metav1.NewTime(time.Now().Truncate(time.Second)) }

// ExitReason is the reason of a container that exited with code and
// whose runtime gave none: Completed, or Error.
func ExitReason(code int32) string {
	if code == 0 {
		return ReasonCompleted
	}
	return ReasonError
}

// Terminated returns a terminated state.
func Terminated(code int32, reason, message string, started, finished metav1.Time) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, Message: message, StartedAt: started, FinishedAt: finished,
	}}
}
