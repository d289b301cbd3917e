package virtualnode

import (
	"fmt"
	"os"
	"strings"

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

// reasonAppArmor is the kubelet's reason for a pod whose AppArmor profile
// cannot be enforced (lifecycle.AppArmorNotAdmittedReason).
const reasonAppArmor = "AppArmor"

// appArmorEnabledFile says whether the kernel enforces AppArmor.
var appArmorEnabledFile = "/sys/module/apparmor/parameters/enabled"

// checkAppArmor is the kubelet's AppArmor admission: a pod that asks for a
// profile other than Unconfined is refused, with the kubelet's message,
// where the host does not enforce AppArmor, and always on a backend that
// runs containers as host processes (nothing would apply the profile); a
// Localhost profile needs a name.
func checkAppArmor(pod *corev1.Pod, hostProcesses bool) string {
	required := false
	var profiles []*corev1.AppArmorProfile
	if psc := pod.Spec.SecurityContext; psc != nil && psc.AppArmorProfile != nil {
		profiles = append(profiles, psc.AppArmorProfile)
	}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if sc := cs[i].SecurityContext; sc != nil && sc.AppArmorProfile != nil {
				profiles = append(profiles, sc.AppArmorProfile)
			}
		}
	}
	for _, p := range profiles {
		if p.Type != corev1.AppArmorProfileTypeUnconfined {
			required = true
		}
	}
	if !required {
		return ""
	}
	switch {
	case hostProcesses:
		return "Cannot enforce AppArmor: this node runs containers as host processes"
	case !appArmorEnabled():
		return "Cannot enforce AppArmor: AppArmor is not enabled on the host"
	}
	for _, p := range profiles {
		if p.Type == corev1.AppArmorProfileTypeLocalhost && (p.LocalhostProfile == nil || strings.TrimSpace(*p.LocalhostProfile) == "") {
			return fmt.Sprintf("Cannot enforce AppArmor: invalid empty AppArmor profile name: %q", p)
		}
	}
	return ""
}

func appArmorEnabled() bool {
	b, err := os.ReadFile(appArmorEnabledFile)
	return err == nil && strings.HasPrefix(string(b), "Y")
}
