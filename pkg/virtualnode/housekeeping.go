package virtualnode

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// Housekeeping: what deleted pods leave, on the node and in the API
// server, as the kubelet's housekeeping and status manager remove it.

// orphanCleanupInterval is how often the node looks for what pods it no
// longer knows left on it.
const orphanCleanupInterval = time.Minute

// cleanupOrphans has the backend remove what pods neither it nor the API
// server knows left on the node (a pod deleted while the node was down,
// whose sandbox went too), as the kubelet's housekeeping removes orphaned
// pod directories: once the pods are listed, then every minute.
func (n *Node) cleanupOrphans(ctx context.Context, oc backend.OrphanCleaner, pods corev1listers.PodLister) {
	t := time.NewTicker(orphanCleanupInterval)
	defer t.Stop()
	for {
		list, err := pods.List(labels.Everything())
		if err == nil {
			known := make(map[types.UID]bool, len(list))
			for _, p := range list {
				known[p.UID] = true
			}
			if err := oc.CleanupOrphans(ctx, func(uid types.UID) bool { return known[uid] }); err != nil {
				n.log.Warn("Removing what deleted pods left on the node", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// deletable reports whether the node is done with pod, a pod being
// deleted: it runs on this node, its terminal status is in the API server
// and its claims are unprepared. Until they are, the pod stays, as the
// kubelet keeps it until its resources are reclaimed
// (PodMightNeedToUnprepareResources): deleting it would let the claim be
// deallocated and its devices given to another pod while the driver still
// has them prepared.
func (n *Node) deletable(p *corev1.Pod) bool {
	return p.Spec.NodeName == n.cfg.Name && p.DeletionTimestamp != nil && terminal(p) && !n.dra.PodMightNeedToUnprepareResources(p.UID)
}

// finishDeletion removes a pod being deleted from the API server once its
// terminal status is there, as the kubelet's status manager does when the
// pod's containers have stopped. virtual-kubelet alone would leave it until
// its grace period ends.
func (n *Node) finishDeletion(ctx context.Context, pod *corev1.Pod) {
	opts := metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: metav1.NewUIDPreconditions(string(pod.UID))}
	err := n.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
	switch {
	case err == nil:
		n.log.Debug("Deleted terminated pod", "pod", key(pod.Namespace, pod.Name))
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || ctx.Err() != nil:
	default:
		n.log.Warn("Deleting terminated pod; it goes when its grace period ends", "pod", key(pod.Namespace, pod.Name), "err", err)
	}
}
