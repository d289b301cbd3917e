package emulator

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/resourcename"
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
		{"unknown field", "metadata: {name: a}\nspec: {containerz: []}", "", []string{`unknown field "spec.containerz"`}},
		{"document markers and comments", "# a pod\n---\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n---\n# nothing\n", "default", nil},
		{"field names are case-sensitive", "metadata: {Name: a}\nspec: {containers: [{name: c}]}", "", []string{`unknown field "metadata.Name"`}},
		{"duplicate field", "metadata: {name: a, name: b}\nspec: {containers: [{name: c}]}", "", []string{`decoding pod manifest`}},
		{"two documents", "metadata: {name: a}\n---\nmetadata: {name: b}", "", []string{"2 YAML documents"}},
		{"extended resources", "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {example.com/foo: 500m, cpu: 500m}, requests: {example.com/foo: 1, example.com/bar: -1}}}]}", "",
			[]string{"spec.containers[0].resources.limits[example.com/foo]: Invalid value: \"500m\": must be an integer: extended resources are counted in whole devices",
				"spec.containers[0].resources.requests[example.com/bar]: Invalid value: \"-1\": must be greater than or equal to 0",
				"spec.containers[0].resources.requests[example.com/foo]: Invalid value: \"1\": must be equal to example.com/foo limit of 500m; for an extended resource set only limits"}},
		{"extended resource requested without a limit", "metadata: {name: a}\nspec: {initContainers: [{name: i, resources: {requests: {example.com/foo: 1}}}], containers: [{name: c}]}", "",
			[]string{"spec.initContainers[0].resources.limits[example.com/foo]: Required value: example.com/foo is requested without a limit", "set limits: {example.com/foo: 1} instead of the request"}},
		{"requests. prefix", "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {requests.example.com/foo: 1}}}]}", "",
			[]string{`spec.containers[0].resources.limits[requests.example.com/foo]: Invalid value: "requests.example.com/foo": doesn't follow the extended resource name standard: must not start with "requests."`}},
		{"native resources", "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {cpu: 1, memory: -1Gi}, requests: {cpu: 2}}}]}", "",
			[]string{`spec.containers[0].resources.limits[memory]: Invalid value: "-1Gi": must be greater than or equal to 0`,
				`spec.containers[0].resources.requests[cpu]: Invalid value: "2": must be less than or equal to cpu limit of 1`}},
		{"native request below its limit", "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {cpu: 2, memory: 1Gi}, requests: {cpu: 500m, ephemeral-storage: 1Gi}}}]}", "default", nil},
		{"devices asked for by the pod", "metadata: {name: a}\nspec: {resources: {limits: {cpu: 1, example.com/foo: 1}}, containers: [{name: c}]}", "",
			[]string{`spec.resources.limits[example.com/foo]: Unsupported value: "example.com/foo": supported values: "cpu", "memory", "hugepages-<size>"; ask for devices in each container's resources.limits`}},
		{"uid is a path", "metadata: {name: a, uid: ../../escaped}\nspec: {containers: [{name: c}]}", "", []string{`metadata.uid: Invalid value: "../../escaped"`, "omit it"}},
		{"uid with a slash", "metadata: {name: a, uid: a/b}\nspec: {containers: [{name: c}]}", "", []string{`metadata.uid: Invalid value: "a/b"`}},
		{"uuid uid", "metadata: {name: a, uid: 0f8d3c1e-5a2b-4c6d-9e7f-1a2b3c4d5e6f}\nspec: {containers: [{name: c}]}", "default", nil},
		{"invalid resource names", "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {gpu: 1, kubernetes.io/foo: 1, hugepages-2Mi: 1Mi, memory: 1Gi}}}]}", "",
			[]string{"spec.containers[0].resources.limits[gpu]: Invalid value: \"gpu\": must be a standard resource for containers (cpu, memory, ephemeral-storage or hugepages-<size>) or an extended resource name with a domain, like example.com/gpu",
				"spec.containers[0].resources.limits[kubernetes.io/foo]: Invalid value: \"kubernetes.io/foo\": names in the kubernetes.io domain are Kubernetes' own resources"}},
		{"request equal to limit", "metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {example.com/foo: 2}, requests: {example.com/foo: 2}}}]}", "default", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pod, err := DecodePod([]byte(tc.manifest))
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
				t.Fatalf("DecodePod accepted %q", tc.manifest)
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
	f.Add([]byte("---\nmetadata: {name: a}\nspec: {containers: [{name: c}]}\n---\nmetadata: {name: b}\n"))
	f.Add([]byte("metadata: {name: a}\nspec: {containers: [{name: c, resources: {limits: {example.com/foo: 1500m}, requests: {example.com/foo: 2}}}]}"))
	f.Add([]byte("metadata: {name: a}\nspec: {containers: [{name: c, resources: {requests: {example.com/foo: 2, cpu: 1}}}]}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		pod, err := DecodePod(data)
		if err != nil {
			return
		}
		if strings.ContainsAny(string(pod.UID), "/\\") || pod.UID == "." || pod.UID == ".." {
			t.Fatalf("accepted a pod UID that is a path: %q", pod.UID)
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
			for name, req := range c.Resources.Requests {
				if lim, ok := c.Resources.Limits[name]; resourcename.Valid(string(name)) && (!ok || lim.Cmp(req) != 0) {
					t.Fatalf("accepted a request of %s (%s) without an equal limit", name, req.String())
				}
			}
			for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
				for name, q := range l {
					if resourcename.Valid(string(name)) && (q.Sign() < 0 || q.MilliValue()%1000 != 0) {
						t.Fatalf("accepted %s: %s, not a whole number of devices", name, q.String())
					}
				}
			}
		}
	})
}
