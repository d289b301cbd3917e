package virtualnode

import (
	"context"
	"encoding/pem"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
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

// tlsServer starts a TLS server of h, speaking HTTP/2 when h2 is set
// (at most streams requests in flight on a connection), that counts the
// connections made to it; rc is a client config that trusts it.
func tlsServer(t *testing.T, h http.Handler, h2 bool, streams int) (rc *rest.Config, conns *atomic.Int64) {
	t.Helper()
	conns = &atomic.Int64{}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if h2 {
		srv.EnableHTTP2 = true
		srv.Config.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: streams}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, conns
}

// TestClientsDialOneConnectionAtATime holds 800 requests in flight at
// once against a server that allows 100 on a connection (as many as an
// HTTP/2 client sends before it hears the server's limit): the clients
// need 8 connections and make no more than those, where client-go's own
// transport dials one for every request that finds the connections full
// (hundreds here, most of them closed again at once).
func TestClientsDialOneConnectionAtATime(t *testing.T) {
	t.Parallel()
	const requests, streams = 800, 100
	var inFlight sync.WaitGroup
	inFlight.Add(requests)
	all := make(chan struct{})
	go func() { inFlight.Wait(); close(all) }()
	rc, conns := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			http.Error(w, "want HTTP/2, got "+r.Proto, http.StatusBadRequest)
			return
		}
		inFlight.Done()
		<-all
		_, _ = w.Write([]byte("{}"))
	}), true, streams)
	cs, err := NewClients(rc, 1e6, 1e6)
	if err != nil {
		t.Fatal(err)
	}
	var g errgroup.Group
	for i := range requests {
		c := cs.Client
		if i%2 == 1 {
			c = cs.Heartbeat // the clients share their connections
		}
		g.Go(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := c.CoreV1().RESTClient().Get().AbsPath("/version").DoRaw(ctx)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n > requests/streams {
		t.Fatalf("%d connections for %d requests at once, %d on each: want %d", n, requests, streams, requests/streams)
	}
}

// TestClientsHTTP1Server: a server that does not speak HTTP/2 (a proxy in
// front of the API server) is reached over HTTP/1.1.
func TestClientsHTTP1Server(t *testing.T) {
	t.Parallel()
	rc, _ := tlsServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("{}"))
	}), false, 0)
	cs, err := NewClients(rc, 1e6, 1e6)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := cs.Client.CoreV1().RESTClient().Get().AbsPath("/version").DoRaw(t.Context()); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
}
