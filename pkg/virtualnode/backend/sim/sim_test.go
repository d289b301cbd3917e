package sim

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

func TestPhases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		policy corev1.RestartPolicy
		run    time.Duration
		delete bool
		want   []corev1.PodPhase
	}{
		{"runs to completion", corev1.RestartPolicyNever, time.Millisecond, false, []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded}},
		{"Always keeps running", corev1.RestartPolicyAlways, time.Millisecond, false, []corev1.PodPhase{corev1.PodPending, corev1.PodRunning}},
		{"deleted while running", corev1.RestartPolicyAlways, 0, true, []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodFailed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ch := make(chan *corev1.Pod, 16)
			b := New(Config{Config: backend.Config{Notify: func(p *corev1.Pod) { ch <- p }}, StartDelay: time.Millisecond, RunDuration: tc.run})
			defer b.Close()
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"},
				Spec: corev1.PodSpec{RestartPolicy: tc.policy,
					InitContainers: []corev1.Container{{Name: "init"}}, Containers: []corev1.Container{{Name: "app"}}},
			}
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			var got []corev1.PodPhase
			timeout := time.After(10 * time.Second)
			for len(got) < len(tc.want) {
				select {
				case p := <-ch:
					if len(got) == 0 || got[len(got)-1] != p.Status.Phase {
						got = append(got, p.Status.Phase)
					}
					if p.Status.Phase == corev1.PodRunning && tc.delete {
						if err := b.DeletePod(context.Background(), pod); err != nil {
							t.Fatal(err)
						}
					}
				case <-timeout:
					t.Fatalf("phases %v, want %v", got, tc.want)
				}
			}
			for i := range tc.want {
				if got[i] != tc.want[i] {
					t.Fatalf("phases %v, want %v", got, tc.want)
				}
			}
			if err := b.Forget(context.Background(), pod); err != nil || len(b.Pods()) != 0 {
				t.Fatalf("Forget: %v, pods left %d", err, len(b.Pods()))
			}
		})
	}
}

// TestPreStart checks that every container gets Config.PreStart, in spec
// order, before it is reported started; that a container whose PreStart
// fails waits with CreateContainerConfigError while the others run; that
// a plain init container failing it holds back the containers after it;
// and that a sidecar (restartable init container) is reported Running.
func TestPreStart(t *testing.T) {
	t.Parallel()
	always := corev1.ContainerRestartPolicyAlways
	spec := corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		InitContainers: []corev1.Container{
			{Name: "init"},
			{Name: "side", RestartPolicy: &always},
		},
		Containers: []corev1.Container{{Name: "a"}, {Name: "b"}},
	}
	for _, tc := range []struct {
		name      string
		fail      string
		wantCalls []string
		// want is each container's state: Running, Completed, or a
		// waiting reason.
		want map[string]string
	}{
		{"all start", "", []string{"init", "side", "a", "b"},
			map[string]string{"init": "Completed", "side": "Running", "a": "Running", "b": "Running"}},
		{"an app container fails", "a", []string{"init", "side", "a", "b"},
			map[string]string{"init": "Completed", "side": "Running", "a": podruntime.ReasonCreateContainerConfigError, "b": "Running"}},
		{"the sidecar fails", "side", []string{"init", "side", "a", "b"},
			map[string]string{"init": "Completed", "side": podruntime.ReasonCreateContainerConfigError, "a": "Running", "b": "Running"}},
		{"the init container fails", "init", []string{"init"},
			map[string]string{"init": podruntime.ReasonCreateContainerConfigError, "side": "PodInitializing", "a": "PodInitializing", "b": "PodInitializing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b *Backend
			var calls []string
			preStart := func(_ context.Context, pod *corev1.Pod, container string) error {
				// Nothing is reported started before its PreStart.
				for _, p := range b.Pods() {
					for _, s := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
						if s.Name == container && s.State.Waiting == nil {
							t.Errorf("PreStart of %s: already %+v", container, s.State)
						}
					}
				}
				calls = append(calls, container)
				if container == tc.fail {
					return errors.New("device plugin PreStartContainer rpc failed with err: boom")
				}
				return nil
			}
			var last *corev1.Pod
			b = New(Config{Config: backend.Config{Notify: func(p *corev1.Pod) { last = p }, PreStart: preStart}})
			defer b.Close()
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: spec}
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(calls, tc.wantCalls) {
				t.Errorf("PreStart calls %v, want %v", calls, tc.wantCalls)
			}
			got := map[string]string{}
			for _, s := range append(last.Status.InitContainerStatuses, last.Status.ContainerStatuses...) {
				switch st := s.State; {
				case st.Running != nil:
					got[s.Name] = "Running"
				case st.Terminated != nil:
					got[s.Name] = st.Terminated.Reason
				case st.Waiting != nil:
					got[s.Name] = st.Waiting.Reason
					if st.Waiting.Reason == podruntime.ReasonCreateContainerConfigError && !strings.Contains(st.Waiting.Message, "boom") {
						t.Errorf("%s: message %q, want the PreStart error", s.Name, st.Waiting.Message)
					}
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("container states %v, want %v", got, tc.want)
			}
		})
	}
}

// TestNoStartDelayReportsOnce: with no start delay there is nothing to see
// before the pod runs, and the pod is reported once, Running (one status
// write per pod).
func TestNoStartDelayReportsOnce(t *testing.T) {
	t.Parallel()
	var got []*corev1.Pod
	b := New(Config{Config: backend.Config{Notify: func(p *corev1.Pod) { got = append(got, p) }}})
	defer b.Close()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app"}}}}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Status.Phase != corev1.PodRunning {
		var phases []corev1.PodPhase
		for _, p := range got {
			phases = append(phases, p.Status.Phase)
		}
		t.Fatalf("reported %v, want one report, Running", phases)
	}
}
