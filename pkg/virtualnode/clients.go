package virtualnode

import (
	"errors"
	"fmt"
	"time"

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
	limited := func() (kubernetes.Interface, error) {
		c := rest.CopyConfig(rc)
		c.RateLimiter = nil
		c.QPS, c.Burst = qps, burst
		return kubernetes.NewForConfig(c)
	}
	var cs Clients
	var err error
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
