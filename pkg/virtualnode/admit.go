package virtualnode

import (
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// The predicates of the kubelet's admission that the node checks
// (lifecycle.generalFilter: the scheduler's AdmissionCheck, then the
// NoExecute taints), with the scheduler plugins' names and reasons, which
// the kubelet reports as the pod's reason and in its message.
const (
	predicateNodeName        = "NodeName"
	predicateNodeAffinity    = "NodeAffinity"
	predicateTaintToleration = "TaintToleration"

	reasonNodeName        = "node(s) didn't match the requested node name"
	reasonNodeAffinity    = "node(s) didn't match Pod's node affinity/selector"
	reasonTaintToleration = "node(s) had taints that the pod didn't tolerate"
)

// predicateFailure is a pod the node refuses, as the kubelet's
// PredicateFailureError: the predicate is the pod's reason, and the
// message "Predicate <name> failed: <reason>".
type predicateFailure struct {
	predicate, reason string
}

func (f *predicateFailure) message() string {
	return fmt.Sprintf("Predicate %s failed: %s", f.predicate, f.reason)
}

// checkPredicates returns the first predicate pod fails on node, nil when
// it may run there: the node's name, the pod's nodeSelector and required
// node affinity against the node's current labels, and its tolerations
// against the node's NoExecute taints. hostProcesses (a backend that runs
// containers as host processes) also holds the pod to the node's own
// NoSchedule taints (own): a pod that names the node in spec.nodeName
// never meets the scheduler, and the taint is what keeps pods off such a
// node unless they mean to be there.
func checkPredicates(pod *corev1.Pod, node *corev1.Node, own []corev1.Taint, hostProcesses bool) *predicateFailure {
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != node.Name {
		return &predicateFailure{predicateNodeName, reasonNodeName}
	}
	if ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(node); !ok {
		return &predicateFailure{predicateNodeAffinity, reasonNodeAffinity}
	}
	noExecute := func(t *corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoExecute }
	// Comparison operators (Gt, Lt) are honoured: the API server admitted
	// the pod's tolerations, so the cluster has them on if a pod uses them.
	if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), node.Spec.Taints, pod.Spec.Tolerations, noExecute, true); untolerated {
		return &predicateFailure{predicateTaintToleration, reasonTaintToleration}
	}
	if hostProcesses {
		noSchedule := func(t *corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoSchedule }
		if _, untolerated := corev1helpers.FindMatchingUntoleratedTaint(logr.Discard(), own, pod.Spec.Tolerations, noSchedule, true); untolerated {
			return &predicateFailure{predicateTaintToleration, reasonTaintToleration}
		}
	}
	return nil
}
