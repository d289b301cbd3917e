package virtualnode

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// refRecorder keeps the object of every event.
type refRecorder struct {
	record.EventRecorder
	refs []*corev1.ObjectReference
}

func (r *refRecorder) Event(obj runtime.Object, _, _, _ string) {
	r.refs = append(r.refs, obj.(*corev1.ObjectReference))
}

// TestEventSink: the backend's container events name the container as the
// kubelet's do (fieldPath), and events before the node runs are dropped.
func TestEventSink(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "init"}},
			Containers:     []corev1.Container{{Name: "app"}},
		},
	}
	var s eventSink
	s.record(pod, "app", corev1.EventTypeWarning, "Unhealthy", "early")
	r := &refRecorder{}
	s.set(r)
	s.record(pod, "app", corev1.EventTypeWarning, "Unhealthy", "m")
	s.record(pod, "init", corev1.EventTypeNormal, "Killing", "m")
	s.record(pod, "", corev1.EventTypeNormal, "Other", "m")
	want := []string{"spec.containers{app}", "spec.initContainers{init}", ""}
	if len(r.refs) != len(want) {
		t.Fatalf("%d events recorded, want %d (none before the recorder is set)", len(r.refs), len(want))
	}
	for i, ref := range r.refs {
		if ref.FieldPath != want[i] || ref.Kind != "Pod" || ref.Name != "p" || ref.Namespace != "ns" || ref.UID != "u1" {
			t.Errorf("event %d about %+v, want pod ns/p with fieldPath %q", i, ref, want[i])
		}
	}
}

// TestWithoutVKSuccess: virtual-kubelet's success events are not recorded,
// its failures and every other event are.
func TestWithoutVKSuccess(t *testing.T) {
	t.Parallel()
	fake := record.NewFakeRecorder(10)
	r := withoutVKSuccess{fake}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	r.Event(pod, corev1.EventTypeNormal, "ProviderCreateSuccess", "Create pod in provider successfully")
	r.Eventf(pod, corev1.EventTypeNormal, "ProviderDeleteSuccess", "%s", "Delete pod in provider successfully")
	r.AnnotatedEventf(pod, nil, corev1.EventTypeNormal, "ProviderUpdateSuccess", "%s", "Update pod in provider successfully")
	r.Event(pod, corev1.EventTypeWarning, "ProviderCreateFailed", "boom")
	r.Eventf(pod, corev1.EventTypeWarning, "UnexpectedAdmissionError", "%s", "no devices")
	close(fake.Events)
	var got []string
	for e := range fake.Events {
		got = append(got, e)
	}
	want := []string{"Warning ProviderCreateFailed boom", "Warning UnexpectedAdmissionError no devices"}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("recorded %q, want %q", got, want)
	}
}
