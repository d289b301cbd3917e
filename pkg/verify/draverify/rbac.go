package draverify

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// The RBAC verify grants the driver: the rules the driver documents
// (--rbac), or dpkit's own.

// defaultRBACSource names where defaultRules come from.
const defaultRBACSource = "ClusterRole dpkit-dra of dpkit's deploy/components/dra/rbac.yaml"

// defaultRules are the rules of the ClusterRole dpkit-dra in
// deploy/components/dra/rbac.yaml: what dpkit's DRA front (and a driver
// on the kubeletplugin helper) needs. The module cannot embed a file
// outside its packages' directories, so they are copied here;
// TestDefaultRulesAreDeploys holds the two equal.
func defaultRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	}
}

// grant is the RBAC the driver is given: ClusterRoles, bound cluster-wide,
// and Roles, made and bound in the run's namespace, each with its name in
// source.
type grant struct {
	source       string
	clusterRoles []rbacv1.ClusterRole
	roles        []rbacv1.Role
}

// defaultGrant is dpkit's own RBAC.
func defaultGrant() *grant {
	return &grant{source: defaultRBACSource, clusterRoles: []rbacv1.ClusterRole{{
		ObjectMeta: metav1.ObjectMeta{Name: "dpkit-dra"}, Rules: defaultRules(),
	}}}
}

// loadGrant reads the RBAC file of --rbac; "" is dpkit's own.
func loadGrant(path string) (*grant, error) {
	if path == "" {
		return defaultGrant(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--rbac: %w", err)
	}
	g, err := parseGrant(data)
	if err != nil {
		return nil, fmt.Errorf("--rbac %s: %w", path, err)
	}
	g.source = path
	return g, nil
}

// skippedKinds are the kinds an RBAC file of a driver's manifests may
// hold beside its roles, which verify replaces with its own: the
// ServiceAccount and the bindings to it.
var skippedKinds = []string{"ServiceAccount", "ClusterRoleBinding", "RoleBinding"}

// parseGrant decodes YAML or JSON documents of rbac.authorization.k8s.io/v1
// ClusterRoles and Roles strictly (an unknown field is an error) and
// reports every problem at once, each with the document it is in.
func parseGrant(data []byte) (*grant, error) {
	g := &grant{}
	var errs []error
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", n, err))
			break
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			errs = append(errs, fmt.Errorf("document %d: %w", n, err))
			continue
		}
		if tm == (metav1.TypeMeta{}) {
			if len(bytes.TrimSpace(stripComments(doc))) > 0 {
				errs = append(errs, fmt.Errorf("document %d: no apiVersion and kind", n))
			}
			continue
		}
		if slices.Contains(skippedKinds, tm.Kind) {
			continue
		}
		if tm.APIVersion != rbacv1.SchemeGroupVersion.String() {
			errs = append(errs, fmt.Errorf("document %d: apiVersion %q, kind %q: want %s ClusterRole or Role", n, tm.APIVersion, tm.Kind, rbacv1.SchemeGroupVersion))
			continue
		}
		switch tm.Kind {
		case "ClusterRole":
			var cr rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &cr); err != nil {
				errs = append(errs, fmt.Errorf("document %d (ClusterRole): %w", n, err))
				continue
			}
			if cr.AggregationRule != nil {
				errs = append(errs, fmt.Errorf("document %d (ClusterRole %s): aggregationRule: verify grants rules it can read; list them in the ClusterRole", n, cr.Name))
			}
			errs = append(errs, ruleProblems(fmt.Sprintf("document %d (ClusterRole %s)", n, cr.Name), cr.Name, cr.Rules, true)...)
			g.clusterRoles = append(g.clusterRoles, cr)
		case "Role":
			var role rbacv1.Role
			if err := yaml.UnmarshalStrict(doc, &role); err != nil {
				errs = append(errs, fmt.Errorf("document %d (Role): %w", n, err))
				continue
			}
			errs = append(errs, ruleProblems(fmt.Sprintf("document %d (Role %s)", n, role.Name), role.Name, role.Rules, false)...)
			g.roles = append(g.roles, role)
		default:
			errs = append(errs, fmt.Errorf("document %d: kind %q: want ClusterRole or Role (%s are left out: verify makes its own)", n, tm.Kind, strings.Join(skippedKinds, ", ")))
		}
	}
	for _, d := range duplicates(g) {
		errs = append(errs, errors.New(d))
	}
	if len(errs) == 0 && len(g.clusterRoles)+len(g.roles) == 0 {
		errs = append(errs, errors.New("no ClusterRole or Role: give the RBAC the driver is deployed with"))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return g, nil
}

// ruleProblems lists what makes rules unusable.
func ruleProblems(where, name string, rules []rbacv1.PolicyRule, cluster bool) []error {
	var errs []error
	if name == "" {
		errs = append(errs, fmt.Errorf("%s: metadata.name is required", where))
	}
	for i, rule := range rules {
		at := fmt.Sprintf("%s: rules[%d]", where, i)
		switch {
		case len(rule.Verbs) == 0:
			errs = append(errs, fmt.Errorf("%s: no verbs", at))
		case len(rule.NonResourceURLs) > 0 && !cluster:
			errs = append(errs, fmt.Errorf("%s: nonResourceURLs are for ClusterRoles only", at))
		case len(rule.NonResourceURLs) > 0 && (len(rule.Resources) > 0 || len(rule.APIGroups) > 0):
			errs = append(errs, fmt.Errorf("%s: nonResourceURLs and resources in one rule", at))
		case len(rule.NonResourceURLs) == 0 && (len(rule.Resources) == 0 || len(rule.APIGroups) == 0):
			errs = append(errs, fmt.Errorf("%s: apiGroups and resources are required (use \"\" for the core group)", at))
		}
	}
	return errs
}

// duplicates names the roles given twice.
func duplicates(g *grant) []string {
	var out []string
	seen := map[string]bool{}
	for _, cr := range g.clusterRoles {
		if seen["ClusterRole "+cr.Name] && cr.Name != "" {
			out = append(out, "ClusterRole "+cr.Name+" is given twice")
		}
		seen["ClusterRole "+cr.Name] = true
	}
	for _, r := range g.roles {
		if seen["Role "+r.Name] && r.Name != "" {
			out = append(out, "Role "+r.Name+" is given twice")
		}
		seen["Role "+r.Name] = true
	}
	return out
}

// stripComments drops YAML comment lines.
func stripComments(doc []byte) []byte {
	var out [][]byte
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, nil)
}
