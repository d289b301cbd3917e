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

// reasonSecurityContext is the reason of a pod refused by a node that runs
// containers as host processes for a security field it cannot apply.
const reasonSecurityContext = "SecurityContext"

// checkHostProcessSecurity returns the first security field of pod that a
// node running containers as host processes cannot apply, as its path, and
// the message refusing the pod; "" when there is none. The rule of the
// node is the kubelet's: a field is applied or the pod does not run.
// A host process has no seccomp filter, SELinux label, runtime class, user
// namespace, read-only root, no_new_privs bit, added capabilities or
// masked /proc. Pod-level fields come first, then the init, app and
// ephemeral containers in order; within each, the order of the checks
// below, so the same pod always names the same field. AppArmor has its
// own check with the kubelet's reason (checkAppArmor); runAsUser,
// runAsGroup, supplementalGroups and runAsNonRoot the backend applies.
//
// capabilities.drop is refused too, whoever the container runs as. As
// root, the process holds the node's capabilities. As another user, it
// starts with none, but the backend leaves the capability bounding set as
// the node's and no_new_privs unset: a setuid-root or file-capability
// program on the host (ping, mount, sudo) gives the capability back. A
// runtime drops it from the bounding set, so that no program in the
// container can regain it; that is what the field asks for.
func checkHostProcessSecurity(pod *corev1.Pod) (field, msg string) {
	if f, v := podSecurityField(&pod.Spec); f != "" {
		return f, hostProcessMessage(f, v, "")
	}
	var scs []*corev1.SecurityContext
	var paths []string
	for i := range pod.Spec.InitContainers {
		scs = append(scs, pod.Spec.InitContainers[i].SecurityContext)
		paths = append(paths, fmt.Sprintf("spec.initContainers[%d].securityContext", i))
	}
	for i := range pod.Spec.Containers {
		scs = append(scs, pod.Spec.Containers[i].SecurityContext)
		paths = append(paths, fmt.Sprintf("spec.containers[%d].securityContext", i))
	}
	for i := range pod.Spec.EphemeralContainers {
		scs = append(scs, pod.Spec.EphemeralContainers[i].SecurityContext)
		paths = append(paths, fmt.Sprintf("spec.ephemeralContainers[%d].securityContext", i))
	}
	for i, sc := range scs {
		if f, v, why := containerSecurityField(sc); f != "" {
			field = paths[i] + "." + f
			return field, hostProcessMessage(field, v, why)
		}
	}
	return "", ""
}

// hostProcessMessage refuses the field at path, set to value, on a node
// that runs containers as host processes; why says more where the reason
// is not plain.
func hostProcessMessage(path, value, why string) string {
	return fmt.Sprintf("Cannot enforce %s (%s): this node runs containers as host processes%s; run the pod on a node with a container runtime (dpkit node --backend cri) or remove the field", path, value, why)
}

// podSecurityField returns the first pod-level field of spec that a host
// process cannot have, with its value.
func podSecurityField(spec *corev1.PodSpec) (field, value string) {
	if psc := spec.SecurityContext; psc != nil {
		if v := seccompValue(psc.SeccompProfile); v != "" {
			return "spec.securityContext.seccompProfile", v
		}
		if v := seLinuxValue(psc.SELinuxOptions); v != "" {
			return "spec.securityContext.seLinuxOptions", v
		}
	}
	if spec.RuntimeClassName != nil && *spec.RuntimeClassName != "" {
		return "spec.runtimeClassName", *spec.RuntimeClassName
	}
	if spec.HostUsers != nil && !*spec.HostUsers {
		return "spec.hostUsers", "false"
	}
	return "", ""
}

// containerSecurityField returns the first field of a container's
// securityContext that a host process cannot have, relative to it, with
// its value and, where needed, why.
func containerSecurityField(sc *corev1.SecurityContext) (field, value, why string) {
	if sc == nil {
		return "", "", ""
	}
	if v := seccompValue(sc.SeccompProfile); v != "" {
		return "seccompProfile", v, ""
	}
	if v := seLinuxValue(sc.SELinuxOptions); v != "" {
		return "seLinuxOptions", v, ""
	}
	if sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem {
		return "readOnlyRootFilesystem", "true", ", which write to the host's filesystem"
	}
	if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
		return "allowPrivilegeEscalation", "false", " without no_new_privs"
	}
	if c := sc.Capabilities; c != nil && len(c.Add) > 0 {
		return "capabilities.add", capabilityList(c.Add), ""
	}
	if c := sc.Capabilities; c != nil && len(c.Drop) > 0 {
		return "capabilities.drop", capabilityList(c.Drop),
			" with the node's capability bounding set, whatever user they run as: a setuid or file-capability program gives a dropped capability back"
	}
	if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount {
		return "procMount", string(corev1.UnmaskedProcMount), ""
	}
	return "", "", ""
}

// seccompValue describes a profile a host process cannot have, "" for none
// or Unconfined.
func seccompValue(p *corev1.SeccompProfile) string {
	switch {
	case p == nil, p.Type == corev1.SeccompProfileTypeUnconfined:
		return ""
	case p.Type == corev1.SeccompProfileTypeLocalhost && p.LocalhostProfile != nil:
		return string(p.Type) + " " + *p.LocalhostProfile
	case p.Type == "":
		return "no type"
	}
	return string(p.Type)
}

// seLinuxValue describes the options' set fields, "" when none is set.
func seLinuxValue(o *corev1.SELinuxOptions) string {
	if o == nil {
		return ""
	}
	var set []string
	for _, f := range []struct{ name, value string }{{"user", o.User}, {"role", o.Role}, {"type", o.Type}, {"level", o.Level}} {
		if f.value != "" {
			set = append(set, f.name+" "+f.value)
		}
	}
	return strings.Join(set, ", ")
}

func capabilityList(cs []corev1.Capability) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}
