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
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// Defaults of the webhook caches. The TTLs are the kubelet's
// (--authentication-token-webhook-cache-ttl 2m,
// --authorization-webhook-cache-authorized-ttl 5m and -unauthorized-ttl
// 30s) except DefaultAuthnFailureCacheTTL: the kubelet caches a token the
// API server refused as long as one it accepted (k8s.io/apiserver's
// DelegatingAuthenticatorConfig passes CacheTTL as both), dpkit keeps it
// 30s like a denial. The sizes bound each cache (least recently used
// entries go first); the kubelet's token cache is bounded by its TTL only,
// its decision cache holds 8192 (k8s.io/apiserver's webhook authorizer).
const (
	DefaultAuthnCacheTTL        = 2 * time.Minute
	DefaultAuthnFailureCacheTTL = 30 * time.Second
	DefaultAllowCacheTTL        = 5 * time.Minute
	DefaultDenyCacheTTL         = 30 * time.Second
	DefaultAuthnCacheSize       = 8192
	DefaultAuthzCacheSize       = 8192
	// DefaultReviewTimeout bounds how long a request waits for its
	// TokenReview or SubjectAccessReview, rate limiter included, like
	// k8s.io/apiserver's shared lookup timeout.
	DefaultReviewTimeout = 30 * time.Second
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
	// Without TokenReviews bearer tokens are refused. Give them clients
	// of their own (their own rate limiters): every unknown bearer token
	// costs a TokenReview, and anyone who reaches the port can send those.
	TokenReviews         authnclient.TokenReviewsGetter
	SubjectAccessReviews authzclient.SubjectAccessReviewsGetter
	// AuthnCacheTTL, AuthnFailureCacheTTL, AllowCacheTTL and DenyCacheTTL
	// default to 2m, 30s, 5m and 30s.
	AuthnCacheTTL, AuthnFailureCacheTTL, AllowCacheTTL, DenyCacheTTL time.Duration
	// AuthnCacheSize bounds the accepted tokens and, separately, the
	// refused ones, so that a flood of made-up tokens cannot push out the
	// accepted ones. AuthzCacheSize bounds the decisions. Both default
	// to 8192.
	AuthnCacheSize, AuthzCacheSize int
	// ReviewTimeout bounds each review, waiting for the rate limiter
	// included. Default 30s.
	ReviewTimeout time.Duration
	Logger        *slog.Logger
	// Now is the clock of the caches; nil means time.Now.
	Now func() time.Time
}

// Auth wraps handlers with authentication and authorization.
type Auth struct {
	cfg AuthConfig
	log *slog.Logger
	// hmacKey keys the token cache: tokens are not kept in memory, and
	// callers cannot pick tokens whose keys collide (as the kubelet's
	// cached token authenticator does).
	hmacKey []byte

	users   *cache.LRUExpireCache // token key -> *User, accepted tokens
	refused *cache.LRUExpireCache // token key -> struct{}, refused tokens
	allowed *cache.LRUExpireCache // decision key -> bool

	tokenFlights flightGroup[*User]
	sarFlights   flightGroup[bool]

	// errLog samples review errors: under a flood every request may
	// fail the same way.
	errMu      sync.Mutex
	errLogNext time.Time
	errDropped int
}

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// NewAuth validates cfg and returns an Auth.
func NewAuth(cfg AuthConfig) (*Auth, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("nodeapi: NodeName is required")
	}
	if cfg.SubjectAccessReviews == nil {
		return nil, errors.New("nodeapi: SubjectAccessReviews is required")
	}
	if cfg.AuthnCacheSize < 0 || cfg.AuthzCacheSize < 0 {
		return nil, errors.New("nodeapi: cache sizes must not be negative")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.AuthnCacheTTL, DefaultAuthnCacheTTL)
	def(&cfg.AuthnFailureCacheTTL, DefaultAuthnFailureCacheTTL)
	def(&cfg.AllowCacheTTL, DefaultAllowCacheTTL)
	def(&cfg.DenyCacheTTL, DefaultDenyCacheTTL)
	def(&cfg.ReviewTimeout, DefaultReviewTimeout)
	if cfg.AuthnCacheSize == 0 {
		cfg.AuthnCacheSize = DefaultAuthnCacheSize
	}
	if cfg.AuthzCacheSize == 0 {
		cfg.AuthzCacheSize = DefaultAuthzCacheSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("nodeapi: cache key: %w", err)
	}
	clock := clockFunc(cfg.Now)
	return &Auth{
		cfg: cfg, log: log, hmacKey: key,
		users:   cache.NewLRUExpireCacheWithClock(cfg.AuthnCacheSize, clock),
		refused: cache.NewLRUExpireCacheWithClock(cfg.AuthnCacheSize, clock),
		allowed: cache.NewLRUExpireCacheWithClock(cfg.AuthzCacheSize, clock),
	}, nil
}

// CacheSizes returns how many unexpired entries the caches hold: tokens
// accepted and refused, and authorization decisions.
func (a *Auth) CacheSizes() (accepted, refused, decisions int) {
	return len(a.users.Keys()), len(a.refused.Keys()), len(a.allowed.Keys())
}

// ErrUnauthenticated is returned by Authenticate when the request carries
// no valid credentials.
var ErrUnauthenticated = errors.New("unauthorized")

// Authenticate identifies the caller by its verified client certificate
// (CN is the user, O the groups) or its bearer token (TokenReview).
// Concurrent requests with one token share one review.
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
	mac := hmac.New(sha256.New, a.hmacKey)
	mac.Write([]byte(token))
	k := string(mac.Sum(nil))
	if u, ok := a.users.Get(k); ok {
		return u.(*User), nil
	}
	if _, ok := a.refused.Get(k); ok {
		return nil, ErrUnauthenticated
	}
	u, err := a.tokenFlights.do(r.Context(), k, func(ctx context.Context) (*User, error) {
		return a.review(ctx, k, token)
	})
	if err != nil {
		return nil, err
	}
	if u == nil {
		return nil, ErrUnauthenticated
	}
	return u, nil
}

// review asks the API server about token and caches the answer; errors are
// not cached.
func (a *Auth) review(ctx context.Context, k, token string) (*User, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.ReviewTimeout)
	defer cancel()
	tr, err := a.cfg.TokenReviews.TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token review: %w", err)
	}
	if !tr.Status.Authenticated {
		a.refused.Add(k, struct{}{}, a.cfg.AuthnFailureCacheTTL)
		return nil, nil
	}
	u := &User{Name: tr.Status.User.Username, UID: tr.Status.User.UID, Groups: tr.Status.User.Groups}
	if len(tr.Status.User.Extra) > 0 {
		u.Extra = map[string]authzv1.ExtraValue{}
		for k, v := range tr.Status.User.Extra {
			u.Extra[k] = authzv1.ExtraValue(v)
		}
	}
	a.users.Add(k, u, a.cfg.AuthnCacheTTL)
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
// subresource. Concurrent identical questions share one review.
func (a *Auth) Authorize(ctx context.Context, u *User, verb, subresource string) (bool, error) {
	k := decisionKey(u, verb, subresource)
	if v, ok := a.allowed.Get(k); ok {
		return v.(bool), nil
	}
	return a.sarFlights.do(ctx, k, func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, a.cfg.ReviewTimeout)
		defer cancel()
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
		a.allowed.Add(k, res.Status.Allowed, ttl)
		return res.Status.Allowed, nil
	})
}

// decisionKey identifies a question to the authorizer: the whole user
// (extra included, sorted) and the attributes, each length-prefixed so
// that no two questions share a key.
func decisionKey(u *User, verb, subresource string) string {
	var b strings.Builder
	w := func(s string) { fmt.Fprintf(&b, "%d:%s", len(s), s) }
	w(u.Name)
	w(u.UID)
	fmt.Fprintf(&b, "%d", len(u.Groups))
	for _, g := range u.Groups {
		w(g)
	}
	keys := make([]string, 0, len(u.Extra))
	for k := range u.Extra {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Fprintf(&b, "%d", len(keys))
	for _, k := range keys {
		w(k)
		fmt.Fprintf(&b, "%d", len(u.Extra[k]))
		for _, v := range u.Extra[k] {
			w(v)
		}
	}
	w(verb)
	w(subresource)
	return b.String()
}

// Wrap returns h behind authentication (401 without valid credentials)
// and authorization (403 when the API server denies).
func (a *Auth) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, err := a.Authenticate(r)
		if err != nil {
			if !errors.Is(err, ErrUnauthenticated) {
				a.logReviewError(r, err, "step", "authentication")
			}
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		verb, sub := Attributes(r)
		ok, err := a.Authorize(r.Context(), u, verb, sub)
		if err != nil {
			a.logReviewError(r, err, "step", "authorization", "user", u.Name)
			http.Error(w, "Authorization error (user="+u.Name+", verb="+verb+", resource=nodes, subresource="+sub+")", http.StatusInternalServerError)
			return
		}
		if !ok {
			http.Error(w, "Forbidden (user="+u.Name+", verb="+verb+", resource=nodes, subresource="+sub+")", http.StatusForbidden)
			return
		}
		a.log.Debug("Node API request", "user", u.Name, "method", r.Method, "path", r.URL.Path)
		h.ServeHTTP(w, r)
	})
}

// errLogInterval is how often review errors are logged at most; the ones
// in between are counted in the next line.
const errLogInterval = 10 * time.Second

// logReviewError logs a failed review, unless the caller went away (its
// request context ended), at most once per errLogInterval.
func (a *Auth) logReviewError(r *http.Request, err error, args ...any) {
	args = append(args, "path", r.URL.Path, "err", err)
	if r.Context().Err() != nil {
		a.log.Debug("Node API request not reviewed: its caller went away", args...)
		return
	}
	now := a.cfg.Now()
	a.errMu.Lock()
	if now.Before(a.errLogNext) {
		a.errDropped++
		a.errMu.Unlock()
		return
	}
	dropped := a.errDropped
	a.errDropped, a.errLogNext = 0, now.Add(errLogInterval)
	a.errMu.Unlock()
	a.log.Error("Node API request not reviewed", append(args, "similarErrorsNotLogged", dropped)...)
}
