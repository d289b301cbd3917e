// Package nodeapi serves a virtual node's kubelet API (logs, exec, /pods,
// /stats/summary) over TLS with the kubelet's webhook authentication and
// authorization: client certificates verified against a CA, bearer
// tokens checked with a TokenReview, and every request authorized with a
// SubjectAccessReview on the node (resource nodes, subresource proxy,
// log, stats or metrics), like the kubelet's --authentication-token-webhook
// and --authorization-mode=Webhook.
package nodeapi

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// Defaults of the kubelet's webhook caches.
const (
	DefaultAuthnCacheTTL = 2 * time.Minute
	DefaultAllowCacheTTL = 5 * time.Minute
	DefaultDenyCacheTTL  = 30 * time.Second
)

// User is an authenticated caller.
type User struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string]authzv1.ExtraValue
}

// AuthConfig configures Auth.
type AuthConfig struct {
	// NodeName is the node the API belongs to; requests are authorized
	// against nodes/<NodeName>.
	NodeName string
	// TokenReviews and SubjectAccessReviews are the API server's review
	// clients (clientset.AuthenticationV1(), clientset.AuthorizationV1()).
	// Without TokenReviews bearer tokens are refused.
	TokenReviews         authnclient.TokenReviewsGetter
	SubjectAccessReviews authzclient.SubjectAccessReviewsGetter
	// AuthnCacheTTL, AllowCacheTTL and DenyCacheTTL default to the
	// kubelet's 2m, 5m and 30s.
	AuthnCacheTTL, AllowCacheTTL, DenyCacheTTL time.Duration
	Logger                                     *slog.Logger
	// Now is the clock of the caches; nil means time.Now.
	Now func() time.Time
}

// Auth wraps handlers with authentication and authorization.
type Auth struct {
	cfg AuthConfig
	log *slog.Logger

	mu    sync.Mutex
	users map[[32]byte]cached[*User]
	sars  map[string]cached[bool]
}

type cached[T any] struct {
	v   T
	exp time.Time
}

// NewAuth validates cfg and returns an Auth.
func NewAuth(cfg AuthConfig) (*Auth, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("nodeapi: NodeName is required")
	}
	if cfg.SubjectAccessReviews == nil {
		return nil, errors.New("nodeapi: SubjectAccessReviews is required")
	}
	if cfg.AuthnCacheTTL == 0 {
		cfg.AuthnCacheTTL = DefaultAuthnCacheTTL
	}
	if cfg.AllowCacheTTL == 0 {
		cfg.AllowCacheTTL = DefaultAllowCacheTTL
	}
	if cfg.DenyCacheTTL == 0 {
		cfg.DenyCacheTTL = DefaultDenyCacheTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Auth{cfg: cfg, log: log, users: map[[32]byte]cached[*User]{}, sars: map[string]cached[bool]{}}, nil
}

// ErrUnauthenticated is returned by Authenticate when the request carries
// no valid credentials.
var ErrUnauthenticated = errors.New("unauthorized")

// Authenticate identifies the caller by its verified client certificate
// (CN is the user, O the groups) or its bearer token (TokenReview).
func (a *Auth) Authenticate(r *http.Request) (*User, error) {
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		return certUser(r.TLS.VerifiedChains[0][0]), nil
	}
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || strings.TrimSpace(token) == "" || a.cfg.TokenReviews == nil {
		return nil, ErrUnauthenticated
	}
	token = strings.TrimSpace(token)
	sum := sha256.Sum256([]byte(token))
	now := a.cfg.Now()
	a.mu.Lock()
	c, hit := a.users[sum]
	a.mu.Unlock()
	if hit && now.Before(c.exp) {
		if c.v == nil {
			return nil, ErrUnauthenticated
		}
		return c.v, nil
	}
	tr, err := a.cfg.TokenReviews.TokenReviews().Create(r.Context(), &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	var u *User
	if tr.Status.Authenticated {
		u = &User{Name: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups}
		if len(tr.Status.User.Extra) > 0 {
			u.Extra = map[string]authzv1.ExtraValue{}
			for k, v := range tr.Status.User.Extra {
				u.Extra[k] = authzv1.ExtraValue(v)
			}
		}
	}
	a.mu.Lock()
	a.users[sum] = cached[*User]{v: u, exp: now.Add(a.cfg.AuthnCacheTTL)}
	a.mu.Unlock()
	if u == nil {
		return nil, ErrUnauthenticated
	}
	return u, nil
}

func certUser(c *x509.Certificate) *User {
	return &User{Name: c.Subject.CommonName, Groups: append([]string(nil), c.Subject.Organization...)}
}

// Attributes maps a request to the kubelet's authorization attributes:
// the verb from the method and the subresource from the path.
func Attributes(r *http.Request) (verb, subresource string) {
	switch r.Method {
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	default:
		verb = "get"
	}
	p := r.URL.Path
	sub := func(prefix string) bool { return p == prefix || strings.HasPrefix(p, prefix+"/") }
	switch {
	case sub("/stats"):
		subresource = "stats"
	case sub("/metrics"):
		subresource = "metrics"
	case sub("/logs"):
		subresource = "log"
	case sub("/spec"):
		subresource = "spec"
	default:
		subresource = "proxy"
	}
	return verb, subresource
}

// Authorize asks the API server whether u may do verb on the node's
// subresource.
func (a *Auth) Authorize(ctx context.Context, u *User, verb, subresource string) (bool, error) {
	k := fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%s", u.Name, u.UID, strings.Join(u.Groups, ","), verb, subresource)
	now := a.cfg.Now()
	a.mu.Lock()
	c, hit := a.sars[k]
	a.mu.Unlock()
	if hit && now.Before(c.exp) {
		return c.v, nil
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Name, UID: u.UID, Groups: u.Groups, Extra: u.Extra,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Verb: verb, Group: "", Version: "v1", Resource: "nodes", Subresource: subresource, Name: a.cfg.NodeName,
		},
	}}
	res, err := a.cfg.SubjectAccessReviews.SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("subject access review: %w", err)
	}
	ttl := a.cfg.DenyCacheTTL
	if res.Status.Allowed {
		ttl = a.cfg.AllowCacheTTL
	}
	a.mu.Lock()
	a.sars[k] = cached[bool]{v: res.Status.Allowed, exp: now.Add(ttl)}
	a.mu.Unlock()
	return res.Status.Allowed, nil
}

// Wrap returns h behind authentication (401 without valid credentials)
// and authorization (403 when the API server denies).
func (a *Auth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := a.Authenticate(r)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				a.log.Error("authenticating request", "path", r.URL.Path, "err", err)
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb, sub := Attributes(r)
		ok, err := a.Authorize(r.Context(), u, verb, sub)
		if err != nil {
			a.log.Error("authorizing request", "user", u.Name, "path", r.URL.Path, "err", err)
			http.Error(w, "Authorization error (user="+u.Name+", verb="+verb+", resource=nodes, subresource="+sub+")", http.StatusInternalServerError)
			return
		}
		if !ok {
			http.Error(w, "Forbidden (user="+u.Name+", verb="+verb+", resource=nodes, subresource="+sub+")", http.StatusForbidden)
			return
		}
		a.log.Debug("node API request", "user", u.Name, "method", r.Method, "path", r.URL.Path)
		h.ServeHTTP(w, r)
	})
}
