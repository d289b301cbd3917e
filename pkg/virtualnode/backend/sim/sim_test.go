package sim

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
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
