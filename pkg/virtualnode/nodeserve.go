package virtualnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/httpserve"
	"github.com/dpkit/dpkit/pkg/virtualnode/nodeapi"
)

// The node API: the kubelet's HTTPS server (logs, exec, /pods, stats,
// /configz, /metrics) behind webhook authentication and authorization.

func (n *Node) startAPI(ctx context.Context, g *errgroup.Group) error {
	cfg := n.cfg
	tlsCfg, err := nodeapi.TLSConfig(cfg.TLSCertFile, cfg.TLSKeyFile, cfg.ClientCAFile, []string{cfg.NodeIP, cfg.Name, "localhost"})
	if err != nil {
		return err
	}
	auth, err := nodeapi.NewAuth(nodeapi.AuthConfig{
		NodeName:             cfg.Name,
		TokenReviews:         cfg.TokenReviewClient.AuthenticationV1(),
		SubjectAccessReviews: cfg.SubjectAccessReviewClient.AuthorizationV1(),
		Logger:               n.log.With("component", "nodeapi"),
	})
	if err != nil {
		return err
	}
	n.auth = auth
	h := nodeapi.Handler(nodeapi.Source{
		NodeName:  cfg.Name,
		Pods:      n.prov.GetPods,
		Backend:   n.be,
		StartTime: time.Now(),
		Metrics:   promhttp.HandlerFor(n.metrics, promhttp.HandlerOpts{}),
		Config:    n.kubeletConfig(),
	})
	n.apiAddr = n.apiLn.Addr()
	close(n.apiReady)
	g.Go(func() error { return serveNodeAPI(ctx, n.apiLn, tlsCfg, auth.Wrap(h)) })
	return nil
}

// kubeletConfig is what the node API's /configz reports.
func (n *Node) kubeletConfig() nodeapi.KubeletConfig {
	cfg := n.cfg
	return nodeapi.KubeletConfig{
		EnableServer:      cfg.Port > 0,
		Address:           cfg.NodeIP,
		Port:              int32(max(cfg.Port, 0)),
		TLSCertFile:       cfg.TLSCertFile,
		TLSPrivateKeyFile: cfg.TLSKeyFile,
		Authentication: nodeapi.KubeletAuthentication{
			X509:    nodeapi.KubeletX509Authentication{ClientCAFile: cfg.ClientCAFile},
			Webhook: nodeapi.KubeletWebhookAuthentication{Enabled: true, CacheTTL: metav1.Duration{Duration: nodeapi.DefaultAuthnCacheTTL}},
		},
		Authorization: nodeapi.KubeletAuthorization{Mode: "Webhook", Webhook: nodeapi.KubeletWebhookAuthorization{
			CacheAuthorizedTTL:   metav1.Duration{Duration: nodeapi.DefaultAllowCacheTTL},
			CacheUnauthorizedTTL: metav1.Duration{Duration: nodeapi.DefaultDenyCacheTTL},
		}},
		RegisterWithTaints:       cfg.Taints,
		NodeLeaseDurationSeconds: DefaultLeaseDuration,
		TopologyManagerPolicy:    cfg.TopologyPolicy,
		TopologyManagerScope:     cfg.TopologyScope,
	}
}

// ErrPortInUse is wrapped by the error of a node whose node API port
// another process serves, beside the syscall's EADDRINUSE.
var ErrPortInUse = errors.New("another process serves that port (a kubelet, another dpkit node)")

// listenNodeAPI listens on addr for the node API. A port another process
// serves is an error wrapping ErrPortInUse, which says so.
func listenNodeAPI(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("node API: %w: %w", err, ErrPortInUse)
	case err != nil:
		return nil, fmt.Errorf("node API: %w", err)
	}
	return l, nil
}

// serveNodeAPI serves h over TLS on l until ctx is done.
func serveNodeAPI(ctx context.Context, l net.Listener, tlsCfg *tls.Config, h http.Handler) error {
	srv := &http.Server{Handler: h, TLSConfig: tlsCfg, ReadHeaderTimeout: 30 * time.Second}
	if err := httpserve.Serve(ctx, srv, tls.NewListener(l, tlsCfg)); err != nil {
		return fmt.Errorf("node API: %w", err)
	}
	return nil
}
