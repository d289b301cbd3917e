package nodeapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authnclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

var floodTokens = flag.Int("flood-tokens", 50_000, "TestTokenFloodMemory: how many made-up tokens to send")

// stubReviews answers reviews without an API server: token "good" is
// alice, anything else is refused; alice may do anything. Calls are
// counted, and block while gate is non-nil and open.
type stubReviews struct {
	tokens, sars atomic.Int64
	gate         chan struct{}
	// cancelled receives a value for each review whose context ended
	// while it waited at the gate.
	cancelled chan struct{}
	authnclient.TokenReviewInterface
}

func (s *stubReviews) TokenReviews() authnclient.TokenReviewInterface { return s }

func (s *stubReviews) wait(ctx context.Context) error {
	if s.gate == nil {
		return nil
	}
	select {
	case <-s.gate:
		return nil
	case <-ctx.Done():
		if s.cancelled != nil {
			s.cancelled <- struct{}{}
		}
		return ctx.Err()
	}
}

func (s *stubReviews) Create(ctx context.Context, tr *authnv1.TokenReview, _ metav1.CreateOptions) (*authnv1.TokenReview, error) {
	s.tokens.Add(1)
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	out := tr.DeepCopy()
	if tr.Spec.Token == "good" {
		out.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice"}}
	}
	return out, nil
}

type sarStub struct {
	*stubReviews
	authzclient.SubjectAccessReviewInterface
}

func (s sarStub) SubjectAccessReviews() authzclient.SubjectAccessReviewInterface { return s }

func (s sarStub) Create(ctx context.Context, sar *authzv1.SubjectAccessReview, _ metav1.CreateOptions) (*authzv1.SubjectAccessReview, error) {
	s.sars.Add(1)
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	out := sar.DeepCopy()
	out.Status.Allowed = sar.Spec.User == "alice"
	return out, nil
}

func newStubAuth(t testing.TB, s *stubReviews, cfg AuthConfig) *Auth {
	t.Helper()
	cfg.NodeName = "vn1"
	cfg.TokenReviews = s
	cfg.SubjectAccessReviews = sarStub{stubReviews: s}
	a, err := NewAuth(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func bearer(token string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/pods", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func randomToken(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestTokenCacheBounded sends more made-up tokens than the cache holds:
// the refused tokens' cache stays at its size, and the accepted token is
// still cached after the flood (its cache is not the refused ones').
func TestTokenCacheBounded(t *testing.T) {
	t.Parallel()
	s := &stubReviews{}
	a := newStubAuth(t, s, AuthConfig{AuthnCacheSize: 64, Now: func() time.Time { return time.Unix(1000, 0) }})
	if _, err := a.Authenticate(bearer("good")); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		if _, err := a.Authenticate(bearer(randomToken(t))); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("made-up token: %v, want ErrUnauthenticated", err)
		}
	}
	accepted, refused, _ := a.CacheSizes()
	if refused > 64 || accepted != 1 {
		t.Fatalf("cache holds %d accepted and %d refused tokens after 1000 made-up ones, want 1 and at most 64", accepted, refused)
	}
	before := s.tokens.Load()
	if u, err := a.Authenticate(bearer("good")); err != nil || u.Name != "alice" {
		t.Fatalf("good token after the flood: %v, %v", u, err)
	}
	if s.tokens.Load() != before {
		t.Fatal("the flood of made-up tokens pushed the accepted one out of the cache")
	}
}

// TestTokenCacheTTL: an accepted token is reviewed again after 2m, a
// refused one after 30s; a refused one is not reviewed again before.
func TestTokenCacheTTL(t *testing.T) {
	t.Parallel()
	s := &stubReviews{}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	a := newStubAuth(t, s, AuthConfig{Now: clock})
	check := func(token string, want int64) {
		t.Helper()
		_, _ = a.Authenticate(bearer(token))
		if got := s.tokens.Load(); got != want {
			t.Fatalf("token %q: %d reviews so far, want %d", token, got, want)
		}
	}
	check("bad", 1)
	check("good", 2)
	advance(DefaultAuthnFailureCacheTTL - time.Second)
	check("bad", 2)
	advance(2 * time.Second)
	check("bad", 3)
	check("good", 3)
	advance(DefaultAuthnCacheTTL)
	check("good", 4)
	if _, refused, _ := a.CacheSizes(); refused != 0 {
		t.Fatalf("%d refused tokens cached past their TTL", refused)
	}
}

// TestConcurrentReviewsShared: many requests with one token at once cost
// one TokenReview, and many identical questions one SubjectAccessReview.
func TestConcurrentReviewsShared(t *testing.T) {
	t.Parallel()
	s := &stubReviews{gate: make(chan struct{})}
	a := newStubAuth(t, s, AuthConfig{})
	const n = 50
	joined := make(chan struct{}, 2*n)
	a.tokenFlights.joined = func() { joined <- struct{}{} }
	a.sarFlights.joined = func() { joined <- struct{}{} }
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for range n {
		wg.Go(func() {
			if _, err := a.Authenticate(bearer("bad")); !errors.Is(err, ErrUnauthenticated) {
				errs <- err
			}
		})
		wg.Go(func() {
			if ok, err := a.Authorize(context.Background(), &User{Name: "alice"}, "get", "proxy"); err != nil || !ok {
				errs <- err
			}
		})
	}
	// The reviews wait at the gate until every caller has joined one.
	for range 2 * n {
		recv(t, joined, "every caller joined a shared review")
	}
	close(s.gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if s.tokens.Load() != 1 || s.sars.Load() != 1 {
		t.Fatalf("%d TokenReviews and %d SubjectAccessReviews for %d identical requests each, want 1 and 1", s.tokens.Load(), s.sars.Load(), n)
	}
}

// TestAbandonedReviewCancelled: a review whose callers have all gone is
// cancelled rather than left waiting for the rate limiter; a caller still
// waiting keeps it going.
func TestAbandonedReviewCancelled(t *testing.T) {
	t.Parallel()
	s := &stubReviews{gate: make(chan struct{}), cancelled: make(chan struct{}, 1)}
	a := newStubAuth(t, s, AuthConfig{})
	joined := make(chan struct{}, 2)
	a.tokenFlights.joined = func() { joined <- struct{}{} }
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	done1, done2 := make(chan error, 1), make(chan error, 1)
	go func() { _, err := a.Authenticate(bearer("x").WithContext(ctx1)); done1 <- err }()
	recv(t, joined, "first caller joined a review")
	go func() { _, err := a.Authenticate(bearer("x").WithContext(ctx2)); done2 <- err }()
	recv(t, joined, "second caller joined the first one's review")
	cancel1()
	if err := <-done1; !errors.Is(err, context.Canceled) {
		t.Fatalf("first caller: %v, want context.Canceled", err)
	}
	select {
	case <-s.cancelled:
		t.Fatal("review cancelled while a caller still waits for it")
	default:
	}
	cancel2()
	<-done2
	recv(t, s.cancelled, "review cancelled once its last caller left")
	if a.tokenFlights.len() != 0 {
		t.Fatal("abandoned review still registered")
	}
}

// TestTokenFloodMemory sends -flood-tokens made-up tokens and reports
// what the caches hold and how much the heap grew.
func TestTokenFloodMemory(t *testing.T) {
	s := &stubReviews{}
	a := newStubAuth(t, s, AuthConfig{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	n := *floodTokens
	if testing.Short() {
		n = 20_000
	}
	for range n {
		_, _ = a.Authenticate(bearer(randomToken(t)))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	accepted, refused, _ := a.CacheSizes()
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d made-up tokens: %d reviews, %d refused tokens cached, heap %+.1f MiB", n, s.tokens.Load(), refused, float64(grew)/(1<<20))
	if refused > DefaultAuthnCacheSize || accepted != 0 {
		t.Fatalf("%d refused tokens cached, want at most %d", refused, DefaultAuthnCacheSize)
	}
	if grew > 16<<20 {
		t.Fatalf("heap grew %d MiB", grew>>20)
	}
	runtime.KeepAlive(a)
}

// recv waits for a value on ch, failing the test after 10s with what was
// expected.
func recv(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("not within 10s: %s", what)
	}
}
