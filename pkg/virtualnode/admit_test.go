package virtualnode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
