package virtualnode

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestClientsKeepLimitersApart exhausts each throttled client's burst and
// checks that the others still get through at once: heartbeats are never
// throttled, and neither review client waits for the other or for the
// node's own traffic. A throttled request would wait ~1000s for its turn;
// the rate limiter fails it at once against the context's deadline.
func TestClientsKeepLimitersApart(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("{}"))
	}))
	defer srv.Close()
	cs, err := NewClients(&rest.Config{Host: srv.URL}, 0.001, 1)
	if err != nil {
		t.Fatal(err)
	}
	call := func(c kubernetes.Interface) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := c.CoreV1().RESTClient().Get().AbsPath("/healthz").DoRaw(ctx)
		return err
	}
	throttled := []struct {
		name string
		c    kubernetes.Interface
	}{
		{"node traffic", cs.Client},
		{"TokenReviews", cs.TokenReviews},
		{"SubjectAccessReviews", cs.SubjectAccessReviews},
	}
	for _, tc := range throttled {
		if err := call(tc.c); err != nil {
			t.Fatalf("%s: first request (its burst): %v", tc.name, err)
		}
		if err := call(tc.c); err == nil {
			t.Fatalf("%s: second request not throttled; the test's rate limit does not bite", tc.name)
		}
	}
	// Every throttled client has spent its burst: heartbeats still pass.
	for i := range 20 {
		if err := call(cs.Heartbeat); err != nil {
			t.Fatalf("heartbeat %d while the other clients are throttled: %v", i, err)
		}
	}
}

// TestClientsHeartbeatTimeout: heartbeats give up after HeartbeatTimeout,
// as the kubelet's.
func TestClientsHeartbeatTimeout(t *testing.T) {
	t.Parallel()
	cs, err := NewClients(&rest.Config{Host: "https://127.0.0.1:1"}, 50, 100)
	if err != nil {
		t.Fatal(err)
	}
	rc, ok := cs.Heartbeat.CoreV1().RESTClient().(*rest.RESTClient)
	if !ok {
		t.Fatalf("heartbeat REST client is %T", cs.Heartbeat.CoreV1().RESTClient())
	}
	if rc.Client.Timeout != HeartbeatTimeout {
		t.Fatalf("heartbeat timeout %v, want %v", rc.Client.Timeout, HeartbeatTimeout)
	}
	if rl := rc.GetRateLimiter(); rl != nil {
		t.Fatalf("heartbeat client throttled by %T", rl)
	}
}
