package podruntime

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestShouldRestart(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	sidecar := &corev1.Container{Name: "side", RestartPolicy: &always}
	plain := &corev1.Container{Name: "c"}
	for _, tc := range []struct {
		name   string
		policy corev1.RestartPolicy
		c      *corev1.Container
		init   bool
		code   int32
		want   bool
	}{
		{"app Always success", corev1.RestartPolicyAlways, plain, false, 0, true},
		{"app unset success", "", plain, false, 0, true},
		{"app OnFailure success", corev1.RestartPolicyOnFailure, plain, false, 0, false},
		{"app OnFailure failure", corev1.RestartPolicyOnFailure, plain, false, 1, true},
		{"app Never failure", corev1.RestartPolicyNever, plain, false, 1, false},
		{"init Always success", corev1.RestartPolicyAlways, plain, true, 0, false},
		{"init Always failure", corev1.RestartPolicyAlways, plain, true, 1, true},
		{"init Never failure", corev1.RestartPolicyNever, plain, true, 1, false},
		{"sidecar Never success", corev1.RestartPolicyNever, sidecar, true, 0, true},
		{"restartPolicy Always on an app container is not a sidecar", corev1.RestartPolicyNever, sidecar, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tc.policy}}
			if got := ShouldRestart(pod, tc.c, tc.init, tc.code); got != tc.want {
				t.Errorf("ShouldRestart = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestGracePeriod(t *testing.T) {
	t.Parallel()
	five, seven := int64(5), int64(7)
	for _, tc := range []struct {
		name string
		pod  corev1.Pod
		want time.Duration
	}{
		{"none", corev1.Pod{}, DefaultGracePeriod},
		{"spec", corev1.Pod{Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &seven}}, 7 * time.Second},
		{"deletion wins", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionGracePeriodSeconds: &five}, Spec: corev1.PodSpec{TerminationGracePeriodSeconds: &seven}}, 5 * time.Second},
	} {
		if got := GracePeriod(&tc.pod); got != tc.want {
			t.Errorf("%s: GracePeriod = %v, want %v", tc.name, got, tc.want)
		}
	}
}

type fakeRun struct{ pod *corev1.Pod }

func (r *fakeRun) Pod() *corev1.Pod      { return r.pod }
func (r *fakeRun) Snapshot() *corev1.Pod { return r.pod.DeepCopy() }

func TestRuns(t *testing.T) {
	t.Parallel()
	run := func(ns, name, uid string, created int64) *fakeRun {
		return &fakeRun{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name, UID: types.UID(uid), CreationTimestamp: metav1.Unix(created, 0),
		}}}
	}
	var s Runs[*fakeRun]
	old, newer, other := run("ns", "p", "u1", 1), run("ns", "p", "u2", 2), run("a", "z", "u3", 3)
	for _, r := range []*fakeRun{newer, old, other} {
		if _, added := s.Add(r.pod.UID, func() *fakeRun { return r }); !added {
			t.Fatalf("%s not added", r.pod.UID)
		}
	}
	if got, added := s.Add("u1", func() *fakeRun { t.Fatal("newRun called for a known UID"); return nil }); added || got != old {
		t.Errorf("Add of a known UID = %v, %v; want the run there, false", got, added)
	}
	if got, ok := s.ByName("ns", "p"); !ok || got != newer {
		t.Errorf("ByName = %v, %v; want the newest", got, ok)
	}
	pods := s.Pods()
	if len(pods) != 3 || pods[0].Name != "z" || pods[1].UID != "u1" && pods[1].UID != "u2" {
		t.Errorf("Pods not ordered by namespace/name: %v", pods)
	}
	if r, ok := s.Remove("u2"); !ok || r != newer {
		t.Errorf("Remove = %v, %v", r, ok)
	}
	if _, ok := s.Get("u2"); ok {
		t.Error("Get after Remove found the run")
	}
	if got, _ := s.ByName("ns", "p"); got != old {
		t.Errorf("ByName after Remove = %v, want the older run", got)
	}
}

func TestMessages(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid"}}
	for got, want := range map[string]string{
		CrashLoopBackOffMessage(20*time.Second, pod, "app"):  "back-off 20s restarting failed container=app pod=p_ns(uid)",
		ProbeKillMessage("app", "Liveness", true):            "Container app failed liveness probe, will be restarted",
		ProbeKillMessage("app", "Startup", false):            "Container app failed startup probe",
		ProbeFailedMessage("Readiness", "HTTP probe failed"): "Readiness probe failed: HTTP probe failed",
		StoppingMessage("app"):                               "Stopping container app",
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := Backoff{Initial: 10 * time.Second, Max: 35 * time.Second}
	var got []time.Duration
	for range 4 {
		got = append(got, b.Delay())
		b.Step()
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 35 * time.Second, 35 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("delays %v, want %v", got, want)
		}
	}
	b.Ran(BackoffResetAfter)
	if b.Delay() != 35*time.Second {
		t.Errorf("a run of exactly BackoffResetAfter reset the back-off")
	}
	b.Ran(BackoffResetAfter + time.Second)
	if b.Delay() != 10*time.Second {
		t.Errorf("Delay after a long run = %v, want Initial", b.Delay())
	}
}
