package podruntime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The probes that reach the pod over the network, as the kubelet's
// pkg/probe/{http,tcp,grpc}.

// kubeletMinor is the kubelet release whose probes these are, in the
// User-Agent of HTTP and gRPC probes and HTTP hooks ("kube-probe/1.37").
const kubeletMinor = "1.37"

// maxHTTPBody is how much of an HTTP probe's answer is read (10 KiB).
const maxHTTPBody = 10 << 10

// probeDialer is the kubelet's probe dialer: SO_LINGER of 1s, so that the
// many short probe connections do not pile up in TIME-WAIT
// (kubernetes/kubernetes#89898).
func probeDialer(timeout time.Duration) *net.Dialer {
	return &net.Dialer{
		Timeout: timeout,
		Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) {
				_ = syscall.SetsockoptLinger(int(fd), syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 1})
			})
		},
	}
}

// ResolvePort is the kubelet's probe.ResolveContainerPort: a number, or
// the name of one of the container's ports.
func ResolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	port := -1
	switch p.Type {
	case intstr.Int:
		port = p.IntValue()
	case intstr.String:
		found := false
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				port, found = int(cp.ContainerPort), true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("port %q not found", p.StrVal)
		}
	}
	if port > 0 && port < 65536 {
		return port, nil
	}
	return port, fmt.Errorf("invalid port number: %v", port)
}

// NewHTTPRequest is the kubelet's NewRequestForHTTPGetAction: the GET of
// the action to its host (the pod's IP by default), with its headers, a
// User-Agent of kube-<purpose>/<release> and Accept */* unless given,
// Host from a Host header.
func NewHTTPRequest(ctx context.Context, h *corev1.HTTPGetAction, c *corev1.Container, podIP, purpose string) (*http.Request, error) {
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	host := h.Host
	if host == "" {
		host = podIP
	}
	port, err := ResolvePort(h.Port, c)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(h.Path)
	if err != nil {
		u = &url.URL{Path: h.Path}
	}
	u.Scheme, u.Host = scheme, net.JoinHostPort(host, strconv.Itoa(port))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	headers := http.Header{}
	for _, hd := range h.HTTPHeaders {
		headers.Add(hd.Name, hd.Value)
	}
	if _, ok := headers["User-Agent"]; !ok {
		headers.Set("User-Agent", "kube-"+purpose+"/"+kubeletMinor)
	}
	if _, ok := headers["Accept"]; !ok {
		headers.Set("Accept", "*/*")
	} else if headers.Get("Accept") == "" {
		headers.Del("Accept")
	}
	req.Header = headers
	req.Host = headers.Get("Host")
	return req, nil
}

// probeTransport is the kubelet's probe transport: no keep-alives, no
// proxy, no compression, certificates not checked.
func probeTransport(timeout time.Duration) *http.Transport {
	return &http.Transport{
		TLSClientConfig:    &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet: probes do not verify the pod's certificate
		DisableKeepAlives:  true,
		Proxy:              http.ProxyURL(nil),
		DisableCompression: true,
		DialContext:        probeDialer(timeout).DialContext,
	}
}

// HTTPProbe is the kubelet's HTTP prober: 2xx passes; a redirect to
// another host is not followed and passes with a warning; anything else
// fails.
func HTTPProbe(req *http.Request, timeout time.Duration) (Outcome, string, error) {
	tr := probeTransport(timeout)
	defer tr.CloseIdleConnections()
	client := &http.Client{Timeout: timeout, Transport: tr, CheckRedirect: localRedirects}
	res, err := client.Do(req)
	if err != nil {
		return OutcomeFailure, err.Error(), nil
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxHTTPBody))
	if err != nil {
		return OutcomeFailure, "", err
	}
	body := string(b)
	if res.StatusCode >= http.StatusOK && res.StatusCode < http.StatusBadRequest {
		if res.StatusCode >= http.StatusMultipleChoices {
			return OutcomeWarning, "Probe terminated redirects, Response body: " + body, nil
		}
		return OutcomeSuccess, body, nil
	}
	return OutcomeFailure, fmt.Sprintf("HTTP probe failed with statuscode: %d", res.StatusCode), nil
}

// localRedirects follows redirects on the same host only, 10 at most,
// as the kubelet's probes (followNonLocalRedirects false).
func localRedirects(req *http.Request, via []*http.Request) error {
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	return nil
}

// TCPProbe passes when a TCP connection opens within the timeout.
func TCPProbe(ctx context.Context, host string, port int, timeout time.Duration) (Outcome, string, error) {
	conn, err := probeDialer(timeout).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return OutcomeFailure, err.Error(), nil
	}
	_ = conn.Close()
	return OutcomeSuccess, "", nil
}

// GRPCProbe is the kubelet's gRPC prober: grpc.health.v1 Check of the
// service must answer SERVING within the timeout, connection included.
func GRPCProbe(ctx context.Context, host, service string, port int, timeout time.Duration) (Outcome, string, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithUserAgent("kube-probe/"+kubeletMinor),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return probeDialer(0).DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		return OutcomeFailure, fmt.Sprintf("error: failed to connect service at %q: %+v", addr, err), nil
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.WaitForReady(true))
	if err != nil {
		st, _ := status.FromError(err)
		switch {
		case st.Code() == codes.DeadlineExceeded && conn.GetState() != connectivity.Ready:
			return OutcomeFailure, fmt.Sprintf("timeout: failed to connect service %q within %v: %+v", addr, timeout, err), nil
		case st.Code() == codes.Unimplemented:
			return OutcomeFailure, "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): " + st.Message(), nil
		case st.Code() == codes.DeadlineExceeded:
			return OutcomeFailure, fmt.Sprintf("timeout: health rpc did not complete within %v", timeout), nil
		}
		return OutcomeFailure, fmt.Sprintf("error: health rpc probe failed: %+v", err), nil
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return OutcomeFailure, fmt.Sprintf("service unhealthy (responded with %q)", resp.GetStatus().String()), nil
	}
	return OutcomeSuccess, "service healthy", nil
}
