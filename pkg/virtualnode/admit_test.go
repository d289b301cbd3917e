package virtualnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestCheckPredicates(t *testing.T) {
	t.Parallel()
	own := corev1.Taint{Key: DefaultTaintKey, Value: "dpkit", Effect: corev1.TaintEffectNoSchedule}
	evict := corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectNoExecute}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"zone": "a", "gpu": "yes"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{own}},
	}
	evicting := node.DeepCopy()
	evicting.Spec.Taints = append(evicting.Spec.Taints, evict)
	tolerateOwn := []corev1.Toleration{{Key: DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	pod := func(f func(*corev1.PodSpec)) *corev1.Pod {
		p := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "n1"}}
		if f != nil {
			f(&p.Spec)
		}
		return p
	}
	for _, tc := range []struct {
		name          string
		pod           *corev1.Pod
		node          *corev1.Node
		hostProcesses bool
		want          string // predicate, "" when admitted
	}{
		{"plain pod, kubelet rules", pod(nil), node, false, ""},
		{"another node's name", pod(func(s *corev1.PodSpec) { s.NodeName = "n2" }), node, false, predicateNodeName},
		{"selector matches", pod(func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"zone": "a"} }), node, false, ""},
		{"selector does not match", pod(func(s *corev1.PodSpec) { s.NodeSelector = map[string]string{"zone": "b"} }), node, false, predicateNodeAffinity},
		{"required affinity does not match", pod(func(s *corev1.PodSpec) {
			s.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu", Operator: corev1.NodeSelectorOpDoesNotExist}}}},
			}}}
		}), node, false, predicateNodeAffinity},
		{"untolerated NoExecute taint", pod(nil), evicting, false, predicateTaintToleration},
		{"tolerated NoExecute taint", pod(func(s *corev1.PodSpec) {
			s.Tolerations = []corev1.Toleration{{Key: "maintenance", Operator: corev1.TolerationOpExists}}
		}), evicting, false, ""},
		{"host processes: own NoSchedule taint untolerated", pod(nil), node, true, predicateTaintToleration},
		{"host processes: own NoSchedule taint tolerated", pod(func(s *corev1.PodSpec) { s.Tolerations = tolerateOwn }), node, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := checkPredicates(tc.pod, tc.node, []corev1.Taint{own}, tc.hostProcesses)
			got := ""
			if f != nil {
				got = f.predicate
			}
			if got != tc.want {
				t.Fatalf("predicate failed: %q, want %q", got, tc.want)
			}
		})
	}
	f := checkPredicates(pod(nil), evicting, nil, false)
	if want := "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"; f == nil || f.message() != want {
		t.Errorf("message %v, want %q (the kubelet's)", f, want)
	}
}

// TestCheckAppArmor: a pod asking for an AppArmor profile is refused with
// the kubelet's message where the host does not enforce AppArmor and on a
// host-process node; Unconfined asks for nothing.
func TestCheckAppArmor(t *testing.T) { //nolint:paralleltest // sets appArmorEnabledFile
	enabled := filepath.Join(t.TempDir(), "enabled")
	old := appArmorEnabledFile
	appArmorEnabledFile = enabled
	t.Cleanup(func() { appArmorEnabledFile = old })
	withProfile := func(p corev1.AppArmorProfileType) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app",
			SecurityContext: &corev1.SecurityContext{AppArmorProfile: &corev1.AppArmorProfile{Type: p}}}}}}
	}
	for _, tc := range []struct {
		host    string
		pod     *corev1.Pod
		hostPro bool
		want    string
	}{
		{"N", withProfile(corev1.AppArmorProfileTypeRuntimeDefault), false, "Cannot enforce AppArmor: AppArmor is not enabled on the host"},
		{"", withProfile(corev1.AppArmorProfileTypeRuntimeDefault), false, "Cannot enforce AppArmor: AppArmor is not enabled on the host"},
		{"Y", withProfile(corev1.AppArmorProfileTypeRuntimeDefault), false, ""},
		{"Y", withProfile(corev1.AppArmorProfileTypeRuntimeDefault), true, "Cannot enforce AppArmor: this node runs containers as host processes"},
		{"Y", withProfile(corev1.AppArmorProfileTypeLocalhost), false, "Cannot enforce AppArmor: invalid empty AppArmor profile name"},
		{"N", withProfile(corev1.AppArmorProfileTypeUnconfined), true, ""},
		{"N", &corev1.Pod{}, false, ""},
	} {
		_ = os.Remove(enabled)
		if tc.host != "" {
			if err := os.WriteFile(enabled, []byte(tc.host+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if got := checkAppArmor(tc.pod, tc.hostPro); !strings.HasPrefix(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("host %q, host processes %v: %q, want %q", tc.host, tc.hostPro, got, tc.want)
		}
	}
}

// TestCheckHostProcessSecurity: on a node that runs containers as host
// processes, every security field such a node cannot apply refuses the
// pod, with the field's path, its value and the fix; the first one in
// the pod's order wins. Unconfined seccomp, empty SELinux options, an
// empty runtime class, hostUsers: true and the identity fields the
// backend applies are admitted.
func TestCheckHostProcessSecurity(t *testing.T) {
	t.Parallel()
	const (
		host = ": this node runs containers as host processes"
		fix  = "; run the pod on a node with a container runtime (dpkit node --backend cri) or remove the field"
	)
	withPod := func(sc *corev1.PodSecurityContext) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) { s.SecurityContext = sc }
	}
	// withContainer sets the securityContext of spec.containers[1].
	withContainer := func(sc *corev1.SecurityContext) func(*corev1.PodSpec) {
		return func(s *corev1.PodSpec) { s.Containers[1].SecurityContext = sc }
	}
	seccomp := func(t corev1.SeccompProfileType) *corev1.SeccompProfile { return &corev1.SeccompProfile{Type: t} }
	drop := &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}
	for _, tc := range []struct {
		name      string
		edit      func(*corev1.PodSpec)
		field     string // "" when admitted
		value, in string // the value in the message, and words it holds
	}{
		{name: "plain pod"},
		{name: "identity fields the backend applies", edit: func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(int64(1000)), RunAsGroup: ptr.To(int64(1000)), RunAsNonRoot: ptr.To(true), SupplementalGroups: []int64{5}}
			s.Containers[1].SecurityContext = &corev1.SecurityContext{RunAsUser: ptr.To(int64(1001)), ReadOnlyRootFilesystem: ptr.To(false), AllowPrivilegeEscalation: ptr.To(true),
				Capabilities: &corev1.Capabilities{}, ProcMount: ptr.To(corev1.DefaultProcMount)}
		}},
		{name: "pod seccomp Unconfined", edit: withPod(&corev1.PodSecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeUnconfined)})},
		{name: "container seccomp Unconfined", edit: withContainer(&corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeUnconfined)})},
		{name: "empty SELinux options", edit: withPod(&corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{}})},
		{name: "empty runtime class", edit: func(s *corev1.PodSpec) { s.RuntimeClassName = ptr.To("") }},
		{name: "hostUsers true", edit: func(s *corev1.PodSpec) { s.HostUsers = ptr.To(true) }},

		{name: "pod seccomp RuntimeDefault", edit: withPod(&corev1.PodSecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}),
			field: "spec.securityContext.seccompProfile", value: "RuntimeDefault"},
		{name: "pod seccomp Localhost", edit: withPod(&corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeLocalhost, LocalhostProfile: ptr.To("audit.json")}}),
			field: "spec.securityContext.seccompProfile", value: "Localhost audit.json"},
		{name: "pod SELinux options", edit: withPod(&corev1.PodSecurityContext{SELinuxOptions: &corev1.SELinuxOptions{Type: "spc_t", Level: "s0:c1"}}),
			field: "spec.securityContext.seLinuxOptions", value: "type spc_t, level s0:c1"},
		{name: "runtime class", edit: func(s *corev1.PodSpec) { s.RuntimeClassName = ptr.To("gvisor") },
			field: "spec.runtimeClassName", value: "gvisor"},
		{name: "hostUsers false", edit: func(s *corev1.PodSpec) { s.HostUsers = ptr.To(false) },
			field: "spec.hostUsers", value: "false"},
		{name: "container seccomp RuntimeDefault", edit: withContainer(&corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}),
			field: "spec.containers[1].securityContext.seccompProfile", value: "RuntimeDefault"},
		{name: "container SELinux options", edit: withContainer(&corev1.SecurityContext{SELinuxOptions: &corev1.SELinuxOptions{User: "system_u"}}),
			field: "spec.containers[1].securityContext.seLinuxOptions", value: "user system_u"},
		{name: "read-only root", edit: withContainer(&corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true)}),
			field: "spec.containers[1].securityContext.readOnlyRootFilesystem", value: "true"},
		{name: "no privilege escalation", edit: withContainer(&corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}),
			field: "spec.containers[1].securityContext.allowPrivilegeEscalation", value: "false", in: "no_new_privs"},
		{name: "capabilities added", edit: withContainer(&corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", "SYS_TIME"}}}),
			field: "spec.containers[1].securityContext.capabilities.add", value: "NET_ADMIN, SYS_TIME"},
		{name: "capabilities dropped as root", edit: withContainer(&corev1.SecurityContext{RunAsUser: ptr.To(int64(0)), Capabilities: drop}),
			field: "spec.containers[1].securityContext.capabilities.drop", value: "ALL", in: "bounding set"},
		// A host process of another user starts with no capabilities, but
		// a setuid or file-capability program gives them back: a runtime
		// drops them from the bounding set, the backend cannot.
		{name: "capabilities dropped as uid 1000", edit: func(s *corev1.PodSpec) {
			s.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(int64(1000)), RunAsNonRoot: ptr.To(true)}
			s.Containers[1].SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"NET_RAW"}}}
		}, field: "spec.containers[1].securityContext.capabilities.drop", value: "NET_RAW", in: "setuid or file-capability program"},
		{name: "capabilities dropped by a container of uid 1000", edit: withContainer(&corev1.SecurityContext{RunAsUser: ptr.To(int64(1000)), Capabilities: drop}),
			field: "spec.containers[1].securityContext.capabilities.drop", value: "ALL"},
		{name: "unmasked /proc", edit: withContainer(&corev1.SecurityContext{ProcMount: ptr.To(corev1.UnmaskedProcMount)}),
			field: "spec.containers[1].securityContext.procMount", value: "Unmasked"},
		{name: "init container", edit: func(s *corev1.PodSpec) {
			s.InitContainers = []corev1.Container{{Name: "init"}, {Name: "init2", SecurityContext: &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}}}
		}, field: "spec.initContainers[1].securityContext.seccompProfile", value: "RuntimeDefault"},
		{name: "ephemeral container", edit: func(s *corev1.PodSpec) {
			s.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug",
				SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}}}}}
		}, field: "spec.ephemeralContainers[0].securityContext.capabilities.add", value: "SYS_PTRACE"},

		// The first field wins: pod-level fields, then init, app and
		// ephemeral containers; within a container, the order of the
		// checks.
		{name: "pod before containers", edit: func(s *corev1.PodSpec) {
			s.HostUsers = ptr.To(false)
			s.InitContainers = []corev1.Container{{Name: "init", SecurityContext: &corev1.SecurityContext{ReadOnlyRootFilesystem: ptr.To(true)}}}
		}, field: "spec.hostUsers", value: "false"},
		{name: "seccomp before SELinux at pod level", edit: withPod(&corev1.PodSecurityContext{
			SELinuxOptions: &corev1.SELinuxOptions{Level: "s0"}, SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}),
			field: "spec.securityContext.seccompProfile", value: "RuntimeDefault"},
		{name: "init before app containers", edit: func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext = &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}
			s.InitContainers = []corev1.Container{{Name: "init", SecurityContext: &corev1.SecurityContext{Capabilities: drop}}}
		}, field: "spec.initContainers[0].securityContext.capabilities.drop", value: "ALL"},
		{name: "app before ephemeral containers", edit: func(s *corev1.PodSpec) {
			s.Containers[1].SecurityContext = &corev1.SecurityContext{ProcMount: ptr.To(corev1.UnmaskedProcMount)}
			s.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug",
				SecurityContext: &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}}}}
		}, field: "spec.containers[1].securityContext.procMount", value: "Unmasked"},
		{name: "earlier container first", edit: func(s *corev1.PodSpec) {
			s.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false)}
			s.Containers[1].SecurityContext = &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}
		}, field: "spec.containers[0].securityContext.allowPrivilegeEscalation", value: "false"},
		{name: "seccomp first within a container", edit: withContainer(&corev1.SecurityContext{
			ProcMount: ptr.To(corev1.UnmaskedProcMount), Capabilities: drop, ReadOnlyRootFilesystem: ptr.To(true), SeccompProfile: seccomp(corev1.SeccompProfileTypeLocalhost)}),
			field: "spec.containers[1].securityContext.seccompProfile", value: "Localhost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b"}}}}
			if tc.edit != nil {
				tc.edit(&pod.Spec)
			}
			field, msg := checkHostProcessSecurity(pod)
			if field != tc.field {
				t.Fatalf("refused for %q (%q), want %q", field, msg, tc.field)
			}
			if tc.field == "" {
				if msg != "" {
					t.Fatalf("admitted with message %q", msg)
				}
				return
			}
			prefix := "Cannot enforce " + tc.field + " (" + tc.value + ")" + host
			if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, fix) || !strings.Contains(msg, tc.in) {
				t.Errorf("message %q, want it to start %q, hold %q and end %q", msg, prefix, tc.in, fix)
			}
		})
	}
	// The message the docs show, whole.
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app",
		SecurityContext: &corev1.SecurityContext{SeccompProfile: seccomp(corev1.SeccompProfileTypeRuntimeDefault)}}}}}
	want := "Cannot enforce spec.containers[0].securityContext.seccompProfile (RuntimeDefault): this node runs containers as host processes; run the pod on a node with a container runtime (dpkit node --backend cri) or remove the field"
	if _, msg := checkHostProcessSecurity(pod); msg != want {
		t.Errorf("message %q, want %q", msg, want)
	}
}
