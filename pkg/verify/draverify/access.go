package draverify

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/internal/verifyproc"
)

// What the driver gets of the API server: a ServiceAccount of its own in
// the run's namespace, bound to the RBAC it documents (grant), and a
// kubeconfig with that ServiceAccount's token and the proxy (proxy.go),
// never verify's own credentials.

// driverServiceAccount is the name of the driver's ServiceAccount in the
// run's namespace.
const driverServiceAccount = "dpkit-verify-driver"

// sandbox is what verify sets up around the driver for one run: its
// identity on the API server, the proxy it reaches the API server
// through, and what tells the run's objects and processes from others'.
type sandbox struct {
	// id is the run's ID: the value of RunLabel and the names' suffix.
	id    string
	owner owner
	// ctx is the run's: an interrupted run judges no RBAC.
	ctx    context.Context
	grant  *grant
	proxy  *apiProxy
	record runRecord
	// upstream is verify's own client configuration.
	upstream *rest.Config
	content  namespaceContent
}

// meta is the metadata of an object the run creates.
func (sb *sandbox) meta(name, namespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{RunLabel: sb.id}}
}

// ownerMeta is meta with the owner annotation, for the Node and the
// Namespace.
func (sb *sandbox) ownerMeta(name string) metav1.ObjectMeta {
	m := sb.meta(name, "")
	o, _ := json.Marshal(sb.owner)
	m.Annotations = map[string]string{ownerAnnotation: string(o)}
	return m
}

// clusterName is the name of a copy of a ClusterRole (and of its
// binding): the run's, so that it is nobody else's.
func (sb *sandbox) clusterName(role string) string {
	return "dpkit-verify-" + sb.id + ":" + role
}

// grantDriver creates the driver's ServiceAccount and its RBAC: a copy of
// each ClusterRole of the grant, bound cluster-wide, and of each Role,
// bound in the run's namespace.
func (r *run) grantDriver(ctx context.Context) error {
	sb := r.sb
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	sa := &corev1.ServiceAccount{ObjectMeta: sb.meta(driverServiceAccount, r.ns)}
	if _, err := r.client.CoreV1().ServiceAccounts(r.ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the driver's ServiceAccount %s/%s: %w", r.ns, driverServiceAccount, err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: driverServiceAccount, Namespace: r.ns}}
	rbac := r.client.RbacV1()
	for _, cr := range sb.grant.clusterRoles {
		name := sb.clusterName(cr.Name)
		role := &rbacv1.ClusterRole{ObjectMeta: sb.meta(name, ""), Rules: cr.Rules}
		if _, err := rbac.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ClusterRole %s (%s's ClusterRole %s): %w", name, sb.grant.source, cr.Name, err)
		}
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: sb.meta(name, ""), Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}}
		if _, err := rbac.ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ClusterRoleBinding %s: %w", name, err)
		}
	}
	for _, ro := range sb.grant.roles {
		role := &rbacv1.Role{ObjectMeta: sb.meta(ro.Name, r.ns), Rules: ro.Rules}
		if _, err := rbac.Roles(r.ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Role %s/%s (%s's Role %s): %w", r.ns, ro.Name, sb.grant.source, ro.Name, err)
		}
		b := &rbacv1.RoleBinding{ObjectMeta: sb.meta(ro.Name, r.ns), Subjects: subject,
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: ro.Name}}
		if _, err := rbac.RoleBindings(r.ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create RoleBinding %s/%s: %w", r.ns, ro.Name, err)
		}
	}
	return nil
}

// tokenLifetime is how long the driver's token and the proxy's
// certificates last: longer than the longest run the configuration
// allows (every wait of the run at its limit), and an hour at least.
func (r *run) tokenLifetime() time.Duration {
	c := r.cfg
	d := c.RegisterTimeout + 8*c.CallTimeout + 3*c.ReregisterThreshold + 16*c.PrepareTimeout + 2*c.HealthTimeout + 3*c.TermTimeout
	return max(time.Hour, 2*d)
}

// driverToken asks the API server for a token of the driver's
// ServiceAccount (TokenRequest).
func (r *run) driverToken(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
	defer cancel()
	want := r.tokenLifetime()
	tr, err := r.client.CoreV1().ServiceAccounts(r.ns).CreateToken(ctx, driverServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(want / time.Second))}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request a token of the driver's ServiceAccount %s/%s: %w", r.ns, driverServiceAccount, err)
	}
	if left := time.Until(tr.Status.ExpirationTimestamp.Time); left < want {
		r.log.Debug("The API server gave the driver's token a shorter life", "asked", want, "expires", tr.Status.ExpirationTimestamp.Time)
	}
	return tr.Status.Token, nil
}

// waitGranted waits until the API server authorizes what the grant
// allows for the driver's token: its RBAC authorizer reads roles and
// bindings from a cache, and a driver forbidden a request in the moment
// before would fail dra.rbac for nothing. It asks as the driver
// (SelfSubjectAccessReview, which every authenticated user may), one
// review per rule.
func (r *run) waitGranted(ctx context.Context, token string) error {
	rc := rest.AnonymousClientConfig(r.sb.upstream)
	rc.BearerToken = token
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	var reviews []authorizationv1.SelfSubjectAccessReviewSpec
	add := func(ns string, rules []rbacv1.PolicyRule) {
		for _, rule := range rules {
			if len(rule.NonResourceURLs) > 0 {
				reviews = append(reviews, authorizationv1.SelfSubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{
					Path: rule.NonResourceURLs[0], Verb: rule.Verbs[0]}})
				continue
			}
			ra := &authorizationv1.ResourceAttributes{Namespace: ns, Verb: rule.Verbs[0], Group: rule.APIGroups[0], Resource: rule.Resources[0]}
			if res, sub, ok := strings.Cut(ra.Resource, "/"); ok {
				ra.Resource, ra.Subresource = res, sub
			}
			if len(rule.ResourceNames) > 0 {
				ra.Name = rule.ResourceNames[0]
			}
			reviews = append(reviews, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: ra})
		}
	}
	for _, cr := range r.sb.grant.clusterRoles {
		add("", cr.Rules)
	}
	for _, ro := range r.sb.grant.roles {
		add(r.ns, ro.Rules)
	}
	deadline := time.Now().Add(r.cfg.CallTimeout)
	for len(reviews) > 0 {
		ssar, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{Spec: reviews[0]}, metav1.CreateOptions{})
		switch {
		case err == nil && ssar.Status.Allowed:
			reviews = reviews[1:]
			continue
		case time.Now().After(deadline):
			why := "not allowed yet"
			if err != nil {
				why = err.Error()
			} else if ssar.Status.Reason != "" {
				why = ssar.Status.Reason
			}
			return fmt.Errorf("the driver's ServiceAccount is not granted %s within %s: %s", describeReview(reviews[0]), r.cfg.CallTimeout, why)
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

func describeReview(s authorizationv1.SelfSubjectAccessReviewSpec) string {
	if s.NonResourceAttributes != nil {
		return s.NonResourceAttributes.Verb + " " + s.NonResourceAttributes.Path
	}
	a := s.ResourceAttributes
	return fmt.Sprintf("%s %s (API group %q)", a.Verb, a.Resource, a.Group)
}

// writeDriverKubeconfig writes the driver's kubeconfig: the proxy, its
// certificate authority and the driver's token, nothing else.
func (r *run) writeDriverKubeconfig(token string) error {
	const name = "dpkit-verify"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: r.sb.proxy.url, CertificateAuthorityData: r.sb.proxy.caPEM}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name, Namespace: r.ns}
	cfg.CurrentContext = name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return err
	}
	r.kubeconfig = filepath.Join(r.root, "kubeconfig")
	if err := os.WriteFile(r.kubeconfig, data, 0o600); err != nil {
		return fmt.Errorf("write the driver's kubeconfig: %w", err)
	}
	return nil
}

// driverEnv is the driver's environment: env without what would lead
// it to other credentials ($KUBECONFIG is the driver's; the in-cluster
// configuration of a pod verify runs in is not), with the run's
// variables.
func (r *run) driverEnv(env []string) []string {
	drop := []string{verifyproc.EnvKubeconfig, "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", envRun, envOwner}
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return slices.Contains(drop, k)
	})
	return append(out, verifyproc.EnvKubeconfig+"="+r.kubeconfig, envRun+"="+r.sb.id, envOwner+"="+r.sb.owner.env())
}
