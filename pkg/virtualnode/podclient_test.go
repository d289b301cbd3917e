package virtualnode

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

// TestHoldingPods checks that virtual-kubelet's deletion of a pod (by UID
// precondition) is refused with Conflict while the pod's claims are
// prepared, and goes through otherwise.
func TestHoldingPods(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "held", UID: "uid-held"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "free", UID: "uid-free"}},
	)
	pods := holdingPods{PodsGetter: client.CoreV1(), held: func(ns, name string, uid types.UID) bool { return ns == "ns" && name == "held" && uid == "uid-held" }}.Pods("ns")
	for _, tc := range []struct {
		name      string
		uid       types.UID
		wantGone  bool
		wantError func(error) bool
	}{
		{"held", "uid-held", false, apierrors.IsConflict},
		{"free", "uid-free", true, func(err error) bool { return err == nil }},
	} {
		opts := metav1.NewDeleteOptions(0)
		opts.Preconditions = metav1.NewUIDPreconditions(string(tc.uid))
		err := pods.Delete(ctx, tc.name, *opts)
		if !tc.wantError(err) {
			t.Errorf("delete %s: %v", tc.name, err)
		}
		_, err = client.CoreV1().Pods("ns").Get(ctx, tc.name, metav1.GetOptions{})
		if gone := apierrors.IsNotFound(err); gone != tc.wantGone {
			t.Errorf("pod %s gone %v, want %v", tc.name, gone, tc.wantGone)
		}
	}
}
