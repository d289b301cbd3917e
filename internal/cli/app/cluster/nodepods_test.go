package cluster

import (
	"context"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dpkit/dpkit/internal/cli"
)

// TestNodePods: the labels and device health of the node's pods, and a
// pod created later is seen once the informer has it.
func TestNodePods(t *testing.T) {
	t.Parallel()
	client := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{"app": "train"}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "app", AllocatedResourcesStatus: []corev1.ResourceStatus{
			{Name: "example.com/foo", Resources: []corev1.ResourceHealth{{ResourceID: "d0", Health: corev1.ResourceHealthStatusUnhealthy}}},
		}}}},
	})
	get := NodePods(t.Context(), client, "n1")
	pods, err := get(t.Context())
	want := map[[2]string]cli.NodePod{{"ns", "p"}: {
		Labels: map[string]string{"app": "train"},
		Health: cli.DeviceHealth{"app": {"example.com/foo": {"d0": "Unhealthy"}}},
	}}
	if err != nil || !reflect.DeepEqual(pods, want) {
		t.Errorf("NodePods = %v, %v; want %v", pods, err, want)
	}
	// A List that waits: the informer cannot sync before the read's
	// context has ended.
	blocked := fake.NewClientset()
	release := make(chan struct{})
	blocked.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil
	})
	defer close(release)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := NodePods(t.Context(), blocked, "n1")(ctx); err == nil {
		t.Error("a read whose context ended before the informer synced: no error")
	}
}
