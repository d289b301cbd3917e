package virtualnode

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// errClaimsPrepared says why a pod being deleted is kept.
var errClaimsPrepared = errors.New("dpkit node: the pod's ResourceClaims are still prepared; it is deleted once they are unprepared")

// holdingPods is the pod client of virtual-kubelet's pod controller. The
// controller removes a pod being deleted from the API server when its
// grace period ends, whatever the node still holds; the kubelet keeps it
// until its resources are reclaimed, its ResourceClaims unprepared among
// them. Deleted sooner, its claims would be deallocated and their devices
// given to other pods while the drivers still have them prepared. So a
// deletion of a pod (by UID precondition, as the controller deletes) whose
// claims held reports (given the pod's namespace, name and UID) is
// answered Conflict, which the controller takes as
// "the pod changed" and drops; the node deletes the pod itself once its
// claims are unprepared (Node.finishDeletion).
type holdingPods struct {
	typedcorev1.PodsGetter
	held func(namespace, name string, uid types.UID) bool
}

func (c holdingPods) Pods(namespace string) typedcorev1.PodInterface {
	return holdingPodInterface{PodInterface: c.PodsGetter.Pods(namespace), namespace: namespace, held: c.held}
}

type holdingPodInterface struct {
	typedcorev1.PodInterface
	namespace string
	held      func(namespace, name string, uid types.UID) bool
}

func (p holdingPodInterface) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	if opts.Preconditions != nil && opts.Preconditions.UID != nil && p.held(p.namespace, name, *opts.Preconditions.UID) {
		return apierrors.NewConflict(corev1.Resource("pods"), name, errClaimsPrepared)
	}
	return p.PodInterface.Delete(ctx, name, opts)
}
