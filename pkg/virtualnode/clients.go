package virtualnode

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// HeartbeatTimeout bounds each Lease renewal and node status update, as
// the kubelet bounds its heartbeat client's requests by its node status
// update frequency (10s) or the lease duration, whichever is shorter.
const HeartbeatTimeout = 10 * time.Second

// Clients are the API clients of the nodes of one process. They are kept
// apart so that one kind of traffic cannot take another's turn at the
// client-side rate limiter:
//
//   - Client (pods, pod status, events, informers, the Node itself) is
//     throttled at the given QPS and burst;
//   - Heartbeat (Lease renewals and node status updates) is not throttled,
//     like the kubelet's heartbeat client (QPS -1), and its requests time
//     out after HeartbeatTimeout; a node that cannot renew its Lease is
//     marked NotReady and its pods evicted;
//   - TokenReviews and SubjectAccessReviews (the node API's webhook
//     authentication and authorization) each have a limiter of their own
//     at the same QPS and burst: anyone who can reach the node API can
//     make the node create TokenReviews by sending made-up bearer tokens,
//     and those must neither delay the node's own writes nor the
//     SubjectAccessReviews of callers that did authenticate.
type Clients struct {
	Client               kubernetes.Interface
	Heartbeat            kubernetes.Interface
	TokenReviews         kubernetes.Interface
	SubjectAccessReviews kubernetes.Interface
}

// NewClients builds Clients from rc, whose own QPS, Burst and RateLimiter
// are ignored.
func NewClients(rc *rest.Config, qps float32, burst int) (*Clients, error) {
	if qps <= 0 || burst <= 0 {
		return nil, errors.New("API client: qps and burst must be positive")
	}
	rc, err := sharedConnections(rc)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	limited := func() (kubernetes.Interface, error) {
		c := rest.CopyConfig(rc)
		c.RateLimiter = nil
		c.QPS, c.Burst = qps, burst
		return kubernetes.NewForConfig(c)
	}
	var cs Clients
	if cs.Client, err = limited(); err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	if cs.TokenReviews, err = limited(); err != nil {
		return nil, fmt.Errorf("TokenReview client: %w", err)
	}
	if cs.SubjectAccessReviews, err = limited(); err != nil {
		return nil, fmt.Errorf("SubjectAccessReview client: %w", err)
	}
	hb := rest.CopyConfig(rc)
	hb.RateLimiter = nil
	hb.QPS, hb.Burst = -1, 0
	hb.Timeout = HeartbeatTimeout
	if cs.Heartbeat, err = kubernetes.NewForConfig(hb); err != nil {
		return nil, fmt.Errorf("heartbeat client: %w", err)
	}
	return &cs, nil
}

// sharedConnections returns rc with a transport of its own for every
// client NewClients makes, HTTP/2 that dials one connection at a time.
// client-go's transport learns that a connection multiplexes requests
// only once its TLS handshake is done, so when every connection has as
// many requests in flight as the API server allows on one (250), each
// further request dials one more: 1 000 nodes starting at once dialed
// 1 200 connections and kept 19, a fifth of their CPU to start spent in
// TLS handshakes, and as much of the API server's. Here the requests that
// find every connection full wait for the one connection being dialed
// and share it. An API server that does not speak HTTP/2 (a proxy in
// front of it) gets client-go's own transport from the first refusal on.
// rc is returned as it is where client-go's transport must stay: a
// transport, dialer, proxy or credential plugin of its own, a proxy from
// the environment, plain HTTP, or DISABLE_HTTP2.
func sharedConnections(rc *rest.Config) (*rest.Config, error) {
	u, err := url.Parse(rc.Host)
	if err != nil || u.Scheme != "https" || rc.Transport != nil || rc.Dial != nil || rc.Proxy != nil ||
		rc.ExecProvider != nil || rc.AuthProvider != nil || os.Getenv("DISABLE_HTTP2") != "" {
		return rc, nil //nolint:nilerr // client-go reports a bad host itself
	}
	if proxy, err := http.ProxyFromEnvironment(&http.Request{URL: u}); err != nil || proxy != nil {
		return rc, nil //nolint:nilerr // client-go's transport goes through the proxy
	}
	tlsConfig, err := rest.TLSConfigFor(rc)
	if err != nil {
		return nil, err
	}
	if tlsConfig == nil {
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	out := rest.CopyConfig(rc)
	out.TLSClientConfig = rest.TLSClientConfig{}
	// Offering HTTP/1.1 too, a server without HTTP/2 answers with it
	// (x/net/http2: "unexpected ALPN protocol"), not a refused handshake.
	h2TLS := tlsConfig.Clone()
	h2TLS.NextProtos = []string{http2.NextProtoTLS, "http/1.1"}
	//nolint:staticcheck // x/net/http2's Transport is deprecated for
	// net/http's own HTTP/2, which dials a connection for every request
	// that finds the connections full, as client-go's: this one dials one
	// at a time (TestClientsDialOneConnectionAtATime).
	out.Transport = &h2First{
		// The health check client-go gives its connections: a ping
		// after 30 idle seconds, the connection closed when none
		// answers in 15.
		h2: &http2.Transport{
			TLSClientConfig:    h2TLS,
			DisableCompression: rc.DisableCompression,
			ReadIdleTimeout:    30 * time.Second,
			PingTimeout:        15 * time.Second,
			IdleConnTimeout:    90 * time.Second,
		},
		fallback: utilnet.SetTransportDefaults(&http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			TLSHandshakeTimeout: 10 * time.Second,
			TLSClientConfig:     tlsConfig.Clone(),
			MaxIdleConnsPerHost: 25,
			DisableCompression:  rc.DisableCompression,
		}),
	}
	return out, nil
}

// h2First sends over HTTP/2 until a server refuses it in the TLS
// handshake, then over fallback.
type h2First struct {
	h2       *http2.Transport //nolint:staticcheck // see sharedConnections
	fallback *http.Transport
	refused  atomic.Bool
}

func (t *h2First) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.refused.Load() {
		resp, err := t.h2.RoundTrip(req) //nolint:staticcheck // see sharedConnections
		// x/net/http2's dial error: nothing of the request was sent.
		if err == nil || !strings.Contains(err.Error(), "http2: unexpected ALPN protocol") {
			return resp, err
		}
		t.refused.Store(true)
	}
	return t.fallback.RoundTrip(req)
}

// CancelRequest does nothing: a request is canceled through its context,
// which both transports watch. client-go's wrappers ask the transport
// they wrap to cancel a request whose client timeout passed, and log a
// warning where it cannot.
func (t *h2First) CancelRequest(*http.Request) {}

// CloseIdleConnections closes both transports' idle connections
// (utilnet.CloseIdleConnectionsFor).
func (t *h2First) CloseIdleConnections() {
	t.h2.CloseIdleConnections() //nolint:staticcheck // see sharedConnections
	t.fallback.CloseIdleConnections()
}
