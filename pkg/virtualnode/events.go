package virtualnode

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// eventSink records the backend's events (backend.Config.Event) with the
// node's recorder. The backend exists, and may run adopted pods, before
// the recorder does: events until then are logged only.
type eventSink struct {
	log *slog.Logger
	rec atomic.Pointer[record.EventRecorder]
}

func (s *eventSink) set(r record.EventRecorder) { s.rec.Store(&r) }

// record records an event about pod, or about its container as the
// kubelet does: involvedObject is the pod with fieldPath
// spec.containers{name} (spec.initContainers{name} for an init
// container).
func (s *eventSink) record(pod *corev1.Pod, container, eventType, reason, message string) {
	r := s.rec.Load()
	if r == nil {
		if s.log != nil {
			s.log.Info("Event before the node runs", "pod", pod.Namespace+"/"+pod.Name, "container", container, "reason", reason, "message", message)
		}
		return
	}
	ref := &corev1.ObjectReference{
		Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
		UID: pod.UID, ResourceVersion: pod.ResourceVersion,
	}
	if container != "" {
		ref.FieldPath = containerFieldPath(pod, container)
	}
	(*r).Event(ref, eventType, reason, message)
}

// containerFieldPath is the kubelet's reference to a container of a pod
// (kubecontainer.GenerateContainerRef).
func containerFieldPath(pod *corev1.Pod, container string) string {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == container {
			return fmt.Sprintf("spec.initContainers{%s}", container)
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		if c.Name == container {
			return fmt.Sprintf("spec.ephemeralContainers{%s}", container)
		}
	}
	return fmt.Sprintf("spec.containers{%s}", container)
}

// virtual-kubelet's pod controller records an event after every provider
// call that succeeds; the kubelet records no such events.
var vkSuccessReasons = map[string]bool{
	"ProviderCreateSuccess": true,
	"ProviderUpdateSuccess": true,
	"ProviderDeleteSuccess": true,
}

// withoutVKSuccess is the recorder given to virtual-kubelet: it records
// what its pod controller reports, but for the success events, which only
// cost the API server a write per pod change and tell users nothing a
// kubelet's events would not (their failures are kept).
type withoutVKSuccess struct{ record.EventRecorder }

func (r withoutVKSuccess) Event(obj runtime.Object, eventType, reason, message string) {
	if !vkSuccessReasons[reason] {
		r.EventRecorder.Event(obj, eventType, reason, message)
	}
}

func (r withoutVKSuccess) Eventf(obj runtime.Object, eventType, reason, format string, args ...any) {
	if !vkSuccessReasons[reason] {
		r.EventRecorder.Eventf(obj, eventType, reason, format, args...)
	}
}

func (r withoutVKSuccess) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventType, reason, format string, args ...any) {
	if !vkSuccessReasons[reason] {
		r.EventRecorder.AnnotatedEventf(obj, annotations, eventType, reason, format, args...)
	}
}
