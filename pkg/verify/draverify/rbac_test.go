package draverify

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// TestDefaultRulesAreDeploys: the rules verify grants a driver by
// default are those of the ClusterRole dpkit-dra that
// deploy/components/dra/rbac.yaml ships.
func TestDefaultRulesAreDeploys(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../../deploy/components/dra/rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	g, err := parseGrant(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.clusterRoles) != 1 || len(g.roles) != 0 || g.clusterRoles[0].Name != "dpkit-dra" {
		t.Fatalf("deploy/components/dra/rbac.yaml: ClusterRoles %v, Roles %v; want the ClusterRole dpkit-dra alone", g.clusterRoles, g.roles)
	}
	if got, want := g.clusterRoles[0].Rules, defaultRules(); !reflect.DeepEqual(got, want) {
		t.Errorf("deploy/components/dra/rbac.yaml's rules:\n  %+v\nverify's defaultRules:\n  %+v\nmake them the same", got, want)
	}
	def := defaultGrant()
	if !reflect.DeepEqual(def.clusterRoles[0].Rules, g.clusterRoles[0].Rules) || def.clusterRoles[0].Name != g.clusterRoles[0].Name {
		t.Errorf("defaultGrant %+v, want the deploy file's ClusterRole", def.clusterRoles)
	}
}

// TestParseGrant: an --rbac file of ClusterRoles and Roles, with the
// bindings and ServiceAccount a driver's manifests have beside them; and
// every problem of a bad one, at once, with the document it is in.
func TestParseGrant(t *testing.T) {
	t.Parallel()
	const good = `# The driver's RBAC.
apiVersion: v1
kind: ServiceAccount
metadata: {name: my-driver, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: my-driver}
rules:
- apiGroups: [resource.k8s.io]
  resources: [resourceslices]
  verbs: [get, list, watch, create, update, delete]
---
# only a comment
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: leader-election, namespace: kube-system}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, create, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: my-driver}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: my-driver}
subjects: [{kind: ServiceAccount, name: my-driver, namespace: kube-system}]
`
	g, err := parseGrant([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.clusterRoles) != 1 || g.clusterRoles[0].Name != "my-driver" || len(g.roles) != 1 || g.roles[0].Name != "leader-election" ||
		!reflect.DeepEqual(g.roles[0].Rules[0].Verbs, []string{"get", "create", "update"}) {
		t.Errorf("parsed %+v", g)
	}

	for _, tc := range []struct {
		name, data string
		want       []string
	}{
		{"nothing", "# no roles\n", []string{"no ClusterRole or Role"}},
		{"only a binding", "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: x}\n", []string{"no ClusterRole or Role"}},
		{"every problem", `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: a}
rules:
- apiGroups: [""]
  resources: [nodes]
  verb: [get]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: b}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: c}
rules:
- nonResourceURLs: [/metrics]
  verbs: [get]
- apiGroups: [""]
  resources: [configmaps]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: d}
aggregationRule: {clusterRoleSelectors: [{matchLabels: {x: y}}]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e}
rules: [{resources: [pods], verbs: [get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e}
`, []string{
			`document 1 (ClusterRole): error unmarshaling JSON: while decoding JSON: json: unknown field "verb"`,
			`document 2: apiVersion "apps/v1", kind "Deployment": want rbac.authorization.k8s.io/v1 ClusterRole or Role`,
			`document 3 (Role c): rules[0]: nonResourceURLs are for ClusterRoles only`,
			`document 3 (Role c): rules[1]: no verbs`,
			`document 4 (ClusterRole d): aggregationRule`,
			`document 5 (ClusterRole e): rules[0]: apiGroups and resources are required`,
			`ClusterRole e is given twice`,
		}},
	} {
		_, err := parseGrant([]byte(tc.data))
		if err == nil {
			t.Errorf("%s: no error, want %q", tc.name, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error\n%v\nwant it to contain %q", tc.name, err, w)
			}
		}
	}
}
