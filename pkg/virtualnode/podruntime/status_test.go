package podruntime

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestComputeStatus(t *testing.T) {
	t.Parallel()
	run := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	exit := func(code int32) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
	}
	wait := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	for _, tc := range []struct {
		name      string
		policy    corev1.RestartPolicy
		init, app []corev1.ContainerState
		deleting  bool
		want      corev1.PodPhase
		ready     bool
	}{
		{"creating", corev1.RestartPolicyAlways, nil, []corev1.ContainerState{wait}, false, corev1.PodPending, false},
		{"running", corev1.RestartPolicyAlways, nil, []corev1.ContainerState{run}, false, corev1.PodRunning, true},
		{"init running", corev1.RestartPolicyAlways, []corev1.ContainerState{run}, []corev1.ContainerState{wait}, false, corev1.PodPending, false},
		{"init failed, Never", corev1.RestartPolicyNever, []corev1.ContainerState{exit(1)}, []corev1.ContainerState{wait}, false, corev1.PodFailed, false},
		{"succeeded", corev1.RestartPolicyNever, []corev1.ContainerState{exit(0)}, []corev1.ContainerState{exit(0)}, false, corev1.PodSucceeded, false},
		{"failed, Never", corev1.RestartPolicyNever, nil, []corev1.ContainerState{exit(0), exit(2)}, false, corev1.PodFailed, false},
		{"failed, OnFailure waits to restart", corev1.RestartPolicyOnFailure, nil, []corev1.ContainerState{exit(2)}, false, corev1.PodRunning, false},
		{"exited, Always waits to restart", corev1.RestartPolicyAlways, nil, []corev1.ContainerState{exit(0)}, false, corev1.PodRunning, false},
		{"deleted after SIGTERM", corev1.RestartPolicyAlways, nil, []corev1.ContainerState{exit(143)}, true, corev1.PodFailed, false},
		{"deleted, clean exit", corev1.RestartPolicyAlways, nil, []corev1.ContainerState{exit(0)}, true, corev1.PodSucceeded, false},
		{"one of two running", corev1.RestartPolicyAlways, nil, []corev1.ContainerState{run, wait}, false, corev1.PodRunning, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tc.policy}}
			st := &corev1.PodStatus{}
			for i, s := range tc.init {
				pod.Spec.InitContainers = append(pod.Spec.InitContainers, corev1.Container{Name: "i" + string(rune('0'+i))})
				st.InitContainerStatuses = append(st.InitContainerStatuses, corev1.ContainerStatus{Name: "i", State: s})
			}
			for i, s := range tc.app {
				pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "c" + string(rune('0'+i))})
				st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: "c", State: s})
			}
			ComputeStatus(pod, st, "10.0.0.1", tc.deleting)
			if st.Phase != tc.want {
				t.Fatalf("phase %s, want %s", st.Phase, tc.want)
			}
			var ready bool
			for _, c := range st.Conditions {
				if c.Type == corev1.PodReady {
					ready = c.Status == corev1.ConditionTrue
				}
			}
			if ready != tc.ready {
				t.Errorf("ready %v, want %v", ready, tc.ready)
			}
			if st.PodIP != "10.0.0.1" || st.StartTime == nil {
				t.Errorf("podIP %q startTime %v", st.PodIP, st.StartTime)
			}
		})
	}
}

// TestComputeStatusBackOff: a pod whose only container waits to restart
// after it failed (CrashLoopBackOff, with its last termination) is
// Running, as the kubelet's getPhase has it, not Pending.
func TestComputeStatusBackOff(t *testing.T) {
	t.Parallel()
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: policy, Containers: []corev1.Container{{Name: "app"}}}}
		st := &corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name:                 "app",
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1}},
		}}}
		ComputeStatus(pod, st, "", false)
		if st.Phase != corev1.PodRunning {
			t.Errorf("%s: phase %s, want Running", policy, st.Phase)
		}
	}
}

// TestComputeStatusConditions: the kubelet's condition reasons as a pod
// ends (seen side by side with a real kubelet in TestRealNodeSideBySide),
// also when the condition was already False before (a container that
// ended before it was ever reported Running), with the pod's generation.
func TestComputeStatusConditions(t *testing.T) {
	t.Parallel()
	wait := corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	run := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	exit := func(code int32) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
	}
	type cond struct {
		status corev1.ConditionStatus
		reason string
	}
	for _, tc := range []struct {
		name   string
		before corev1.ContainerState
		end    corev1.ContainerState
		want   map[corev1.PodConditionType]cond
	}{
		{"succeeded after running", run, exit(0), map[corev1.PodConditionType]cond{
			corev1.PodInitialized: {"True", "PodCompleted"}, corev1.ContainersReady: {"False", "PodCompleted"}, corev1.PodReady: {"False", "PodCompleted"}, corev1.PodScheduled: {"True", ""},
		}},
		{"succeeded, never seen running", wait, exit(0), map[corev1.PodConditionType]cond{
			corev1.PodInitialized: {"True", "PodCompleted"}, corev1.ContainersReady: {"False", "PodCompleted"}, corev1.PodReady: {"False", "PodCompleted"},
		}},
		{"failed after running", run, exit(1), map[corev1.PodConditionType]cond{
			corev1.PodInitialized: {"True", ""}, corev1.ContainersReady: {"False", "PodFailed"}, corev1.PodReady: {"False", "PodFailed"},
		}},
		{"failed, never seen running", wait, exit(1), map[corev1.PodConditionType]cond{
			corev1.ContainersReady: {"False", "PodFailed"}, corev1.PodReady: {"False", "PodFailed"},
		}},
		{"running", wait, run, map[corev1.PodConditionType]cond{
			corev1.PodInitialized: {"True", ""}, corev1.ContainersReady: {"True", ""}, corev1.PodReady: {"True", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "app"}}}}
			pod.Generation = 3
			st := &corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "app", State: tc.before}}}
			ComputeStatus(pod, st, "", false)
			st.ContainerStatuses[0].State = tc.end
			ComputeStatus(pod, st, "", false)
			got := map[corev1.PodConditionType]cond{}
			for _, c := range st.Conditions {
				got[c.Type] = cond{c.Status, c.Reason}
				if c.ObservedGeneration != 3 {
					t.Errorf("%s: observedGeneration %d, want the pod's 3", c.Type, c.ObservedGeneration)
				}
			}
			for typ, want := range tc.want {
				if got[typ] != want {
					t.Errorf("%s: %v, want %v (all: %v)", typ, got[typ], want, got)
				}
			}
			if st.ObservedGeneration != 3 {
				t.Errorf("status observedGeneration %d, want 3", st.ObservedGeneration)
			}
		})
	}
}

// TestComputeProbedStatus: with probes, a running container is started and
// ready as probed says, never ready before started, and the pod is Ready
// only when every app container and sidecar is.
func TestComputeProbedStatus(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "setup"}, {Name: "proxy", RestartPolicy: &always}},
		Containers:     []corev1.Container{{Name: "app"}},
	}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	done := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}
	type probed struct{ started, ready bool }
	for _, tc := range []struct {
		name      string
		probes    map[string]probed
		wantReady map[string]bool
		podReady  bool
	}{
		{"all ready", map[string]probed{"proxy": {true, true}, "app": {true, true}}, map[string]bool{"setup": true, "proxy": true, "app": true}, true},
		{"sidecar not ready", map[string]probed{"proxy": {true, false}, "app": {true, true}}, map[string]bool{"setup": true, "proxy": false, "app": true}, false},
		{"app not started", map[string]probed{"proxy": {true, true}, "app": {false, true}}, map[string]bool{"setup": true, "proxy": true, "app": false}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st := &corev1.PodStatus{
				InitContainerStatuses: []corev1.ContainerStatus{{Name: "setup", State: done}, {Name: "proxy", State: running}},
				ContainerStatuses:     []corev1.ContainerStatus{{Name: "app", State: running}},
			}
			ComputeProbedStatus(pod, st, "", false, func(name string) (bool, bool) {
				p := tc.probes[name]
				return p.started, p.ready
			})
			for _, cs := range append(st.InitContainerStatuses, st.ContainerStatuses...) {
				if cs.Ready != tc.wantReady[cs.Name] {
					t.Errorf("%s ready %v, want %v", cs.Name, cs.Ready, tc.wantReady[cs.Name])
				}
				if p, ok := tc.probes[cs.Name]; ok && *cs.Started != p.started {
					t.Errorf("%s started %v, want %v", cs.Name, *cs.Started, p.started)
				}
			}
			for _, c := range st.Conditions {
				if (c.Type == corev1.PodReady || c.Type == corev1.ContainersReady) && (c.Status == corev1.ConditionTrue) != tc.podReady {
					t.Errorf("%s %s, want ready %v", c.Type, c.Status, tc.podReady)
				}
			}
		})
	}
}
