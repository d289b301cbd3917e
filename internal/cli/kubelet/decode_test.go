package kubelet

import (
	"strings"
	"testing"
)

func TestDecodePod(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		manifest string
		wantNS   string
		wantErr  []string
	}{
		{"defaults", "metadata: {name: a}\nspec: {containers: [{name: c}]}", "default", nil},
		{"json", `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a","namespace":"ml","uid":"u1"},"spec":{"containers":[{"name":"c"}]}}`, "ml", nil},
		{"sidecar and init", "metadata: {name: a}\nspec:\n  initContainers: [{name: i}, {name: s, restartPolicy: Always}]\n  containers: [{name: c}]", "default", nil},
		{"wrong kind", "kind: Deployment\nmetadata: {name: a}", "", []string{`kind: "Deployment" is not Pod`}},
		{"no containers", "metadata: {name: a}", "", []string{"spec.containers: Required"}},
		{"init and app share a name", "metadata: {name: a}\nspec: {initContainers: [{name: c}], containers: [{name: c}]}", "", []string{"spec.containers[0].name: Duplicate"}},
		{"unnamed container", "metadata: {name: a}\nspec: {containers: [{image: x}]}", "", []string{"spec.containers[0].name: Required"}},
		{"bad name", "metadata: {name: A_b}\nspec: {containers: [{name: c}]}", "", []string{"metadata.name: Invalid"}},
		{"not yaml", "{", "", []string{"decoding pod manifest"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod, err := decodePod([]byte(tc.manifest))
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if pod.Namespace != tc.wantNS || pod.UID == "" {
					t.Errorf("pod %s/%s uid %q, want namespace %s and a UID", pod.Namespace, pod.Name, pod.UID, tc.wantNS)
				}
				return
			}
			if err == nil {
				t.Fatalf("decodePod accepted %q", tc.manifest)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func FuzzDecodePod(f *testing.F) {
	f.Add([]byte("metadata: {name: a}\nspec: {containers: [{name: c}]}"))
	f.Add([]byte(`{"metadata":{"name":"a","namespace":"ml"},"spec":{"containers":[{"name":"c","resources":{"limits":{"example.com/foo":"1"}}}]}}`))
	f.Add([]byte("kind: Pod\nmetadata: {name: a}\nspec: {initContainers: [{name: i}], containers: [{name: c}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pod, err := decodePod(data)
		if err != nil {
			return
		}
		if pod.Name == "" || pod.Namespace == "" || pod.UID == "" || len(pod.Spec.Containers) == 0 {
			t.Fatalf("accepted pod without name, namespace, UID or containers: %+v", pod.ObjectMeta)
		}
		seen := map[string]bool{}
		for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
			if c.Name == "" || seen[c.Name] {
				t.Fatalf("accepted empty or duplicate container name %q", c.Name)
			}
			seen[c.Name] = true
		}
	})
}
