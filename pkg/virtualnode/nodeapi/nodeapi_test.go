package nodeapi

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeReviews answers TokenReviews for token "good" (user alice) and
// allows SubjectAccessReviews for alice on nodes/proxy only.
func fakeReviews(t *testing.T, sars *atomic.Int32) *fake.Clientset {
	t.Helper()
	c := fake.NewClientset()
	c.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview).DeepCopy()
		if tr.Spec.Token == "good" {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: "alice", Groups: []string{"devs"}}}
		}
		return true, tr, nil
	})
	c.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sars.Add(1)
		sar := a.(k8stesting.CreateAction).GetObject().(*authzv1.SubjectAccessReview).DeepCopy()
		ra := sar.Spec.ResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "alice" && ra.Resource == "nodes" && ra.Name == "vn1" && ra.Subresource == "proxy"
		return true, sar, nil
	})
	return c
}

func TestWrap(t *testing.T) {
	t.Parallel()
	var sars atomic.Int32
	c := fakeReviews(t, &sars)
	now := time.Unix(1000, 0)
	a, err := NewAuth(AuthConfig{NodeName: "vn1", TokenReviews: c.AuthenticationV1(), SubjectAccessReviews: c.AuthorizationV1(), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	h := a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	for _, tc := range []struct {
		name, method, path, token string
		want                      int
	}{
		{"anonymous", http.MethodPost, "/exec/ns/p/c", "", http.StatusUnauthorized},
		{"bad token", http.MethodGet, "/pods", "bad", http.StatusUnauthorized},
		{"allowed proxy", http.MethodGet, "/pods", "good", http.StatusTeapot},
		{"allowed exec", http.MethodPost, "/exec/ns/p/c", "good", http.StatusTeapot},
		{"denied stats", http.MethodGet, "/stats/summary", "good", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, tc.path, nil)
			if tc.token != "" {
				r.Header.Set("Authorization", "Bearer "+tc.token)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("%s %s: %d %q, want %d", tc.method, tc.path, w.Code, w.Body.String(), tc.want)
			}
		})
	}
	// Decisions are cached: asking again does not review again.
	before := sars.Load()
	r := httptest.NewRequest(http.MethodGet, "/pods", nil)
	r.Header.Set("Authorization", "Bearer good")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if sars.Load() != before {
		t.Errorf("cached decision reviewed again")
	}
	now = now.Add(DefaultAllowCacheTTL + time.Second)
	h.ServeHTTP(httptest.NewRecorder(), r)
	if sars.Load() != before+1 {
		t.Errorf("expired decision not reviewed again")
	}
}

func TestClientCertificate(t *testing.T) {
	t.Parallel()
	cert, err := SelfSigned([]string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	var sars atomic.Int32
	c := fakeReviews(t, &sars)
	a, err := NewAuth(AuthConfig{NodeName: "vn1", SubjectAccessReviews: c.AuthorizationV1()})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest(http.MethodGet, "/pods", nil)
	r.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}
	u, err := a.Authenticate(r)
	if err != nil || u.Name != "dpkit-node" {
		t.Fatalf("Authenticate = %+v, %v; want the certificate's CN", u, err)
	}
	// Unverified certificates do not count.
	r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}
	if _, err := a.Authenticate(r); err == nil {
		t.Fatal("unverified certificate authenticated")
	}
}

func TestAttributes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ method, path, verb, sub string }{
		{http.MethodGet, "/stats/summary", "get", "stats"},
		{http.MethodGet, "/statsx", "get", "proxy"},
		{http.MethodGet, "/metrics", "get", "metrics"},
		{http.MethodGet, "/logs/x", "get", "log"},
		{http.MethodGet, "/containerLogs/a/b/c", "get", "proxy"},
		{http.MethodPost, "/exec/a/b/c", "create", "proxy"},
	} {
		v, s := Attributes(httptest.NewRequest(tc.method, tc.path, nil))
		if v != tc.verb || s != tc.sub {
			t.Errorf("%s %s: %s %s, want %s %s", tc.method, tc.path, v, s, tc.verb, tc.sub)
		}
	}
}
