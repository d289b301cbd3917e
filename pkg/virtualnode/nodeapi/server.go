package nodeapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"time"

	vkapi "github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// TLSConfig returns the server TLS configuration: the key pair from
// certFile/keyFile, or a self-signed certificate for hosts when both are
// empty; client certificates are verified against clientCAFile when set.
func TLSConfig(certFile, keyFile, clientCAFile string, hosts []string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	switch {
	case certFile != "" && keyFile != "":
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert-file/--tls-private-key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case certFile != "" || keyFile != "":
		return nil, errors.New("--tls-cert-file and --tls-private-key-file go together: give both or neither (self-signed)")
	default:
		cert, err := SelfSigned(hosts)
		if err != nil {
			return nil, err
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca-file %s: no PEM certificate found", clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
	}
	return cfg, nil
}

// SelfSigned makes a self-signed serving certificate for hosts (IP
// addresses or DNS names), valid for one year.
func SelfSigned(hosts []string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "dpkit-node"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// Source is what the handlers read: the node's pods as the API server
// assigned them, and the backend for logs, exec and stats.
type Source struct {
	NodeName string
	Pods     func(context.Context) ([]*corev1.Pod, error)
	Backend  backend.Backend
	// Node returns the node's capacity for the stats summary; may be nil.
	StartTime time.Time
	// Metrics, when set, serves /metrics (the kubelet's nodes/metrics
	// subresource).
	Metrics http.Handler
	// Config is served at /configz.
	Config KubeletConfig
}

// Handler returns the kubelet API handlers (virtual-kubelet's) over src:
// /pods, /runningpods/, /containerLogs, /exec, /attach, /portForward,
// /stats/summary, /metrics/resource, /metrics, /configz and /healthz.
// Capabilities the backend lacks answer 501.
func Handler(src Source) http.Handler {
	cfg := vkapi.PodHandlerConfig{
		GetPods:               runningPods(src.Backend),
		GetPodsFromKubernetes: src.Pods,
		StreamIdleTimeout:     4 * time.Hour,
		StreamCreationTimeout: 30 * time.Second,
	}
	if lr, ok := src.Backend.(backend.LogReader); ok {
		cfg.GetContainerLogs = func(ctx context.Context, ns, pod, container string, o vkapi.ContainerLogOpts) (io.ReadCloser, error) {
			opts := backend.LogOptions{Tail: -1, LimitBytes: o.LimitBytes, Timestamps: o.Timestamps, Follow: o.Follow, Previous: o.Previous, SinceTime: o.SinceTime}
			if o.Tail > 0 {
				opts.Tail = o.Tail
			}
			if o.SinceSeconds > 0 {
				opts.SinceTime = time.Now().Add(-time.Duration(o.SinceSeconds) * time.Second)
			}
			return lr.Logs(ctx, ns, pod, container, opts)
		}
	}
	if ex, ok := src.Backend.(backend.Executor); ok {
		cfg.RunInContainer = func(ctx context.Context, ns, pod, container string, cmd []string, a vkapi.AttachIO) error {
			eio := backend.ExecIO{TTY: a.TTY()}
			if in := a.Stdin(); in != nil {
				eio.Stdin = in
			}
			if out := a.Stdout(); out != nil {
				eio.Stdout = out
				defer out.Close()
			}
			if errw := a.Stderr(); errw != nil {
				eio.Stderr = errw
				defer errw.Close()
			}
			return ex.Exec(ctx, ns, pod, container, cmd, eio)
		}
	}
	if at, ok := src.Backend.(backend.Attacher); ok {
		cfg.AttachToContainer = func(ctx context.Context, ns, pod, container string, a vkapi.AttachIO) error {
			eio := backend.ExecIO{TTY: a.TTY()}
			if in := a.Stdin(); in != nil {
				eio.Stdin = in
			}
			if out := a.Stdout(); out != nil {
				eio.Stdout = out
				defer out.Close()
			}
			if errw := a.Stderr(); errw != nil {
				eio.Stderr = errw
				defer errw.Close()
			}
			return at.Attach(ctx, ns, pod, container, eio)
		}
	}
	if pf, ok := src.Backend.(backend.PortForwarder); ok {
		cfg.PortForward = pf.PortForward
	}
	if src.Backend != nil {
		cfg.GetStatsSummary = func(ctx context.Context) (*statsv1alpha1.Summary, error) { return summary(ctx, src) }
	}
	// debug serves /runningpods/, which the kubelet serves too.
	h := vkapi.PodHandler(cfg, true)
	mux := http.NewServeMux()
	mux.Handle("/", h)
	if src.Metrics != nil {
		mux.Handle("/metrics", src.Metrics)
	}
	if src.Backend != nil {
		rm := resourceMetrics(src)
		mux.Handle("/metrics/resource", rm)
		mux.Handle("/metrics/resource/", rm)
	}
	mux.Handle("/configz", configz(src.Config))
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/healthz/", healthz)
	return mux
}
