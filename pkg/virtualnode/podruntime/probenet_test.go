package podruntime

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestHTTPProbe: the kubelet's HTTP prober: redirects on the same host
// are followed, to another host they end the probe with a warning, the
// body read is 10 KiB at most.
func TestHTTPProbe(t *testing.T) {
	t.Parallel()
	other := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(other.Close)
	otherURL := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/local":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/away":
			http.Redirect(w, r, otherURL, http.StatusFound)
		case "/big":
			_, _ = w.Write([]byte(strings.Repeat("x", 20<<10)))
		case "/ok":
			_, _ = w.Write([]byte("fine"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		path   string
		want   Outcome
		output string
	}{
		{"/local", OutcomeSuccess, "fine"},
		{"/away", OutcomeWarning, "Probe terminated redirects, Response body: "},
		{"/big", OutcomeSuccess, strings.Repeat("x", 10<<10)},
		{"/missing", OutcomeFailure, "HTTP probe failed with statuscode: 404"},
	} {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		out, output, err := HTTPProbe(req, 5*time.Second)
		if err != nil || out != tc.want || !strings.HasPrefix(output, tc.output) || tc.path == "/big" && output != tc.output {
			t.Errorf("%s: %s %.60q %v, want %s %.60q", tc.path, out, output, err, tc.want, tc.output)
		}
	}
}

// TestTCPAndGRPCProbes: a TCP probe passes when the port accepts; a gRPC
// probe passes when grpc.health.v1 answers SERVING for its service, with
// the kubelet's messages otherwise.
func TestTCPAndGRPCProbes(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	hs.SetServingStatus("up", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("down", healthpb.HealthCheckResponse_NOT_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	bare, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bareSrv := grpc.NewServer()
	go func() { _ = bareSrv.Serve(bare) }()
	t.Cleanup(bareSrv.Stop)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := closed.Addr().(*net.TCPAddr).Port
	_ = closed.Close()
	port := l.Addr().(*net.TCPAddr).Port
	barePort := bare.Addr().(*net.TCPAddr).Port
	ctx := context.Background()

	if out, _, err := TCPProbe(ctx, "127.0.0.1", port, time.Second); out != OutcomeSuccess || err != nil {
		t.Errorf("tcp to a listening port: %s %v", out, err)
	}
	if out, msg, err := TCPProbe(ctx, "127.0.0.1", closedPort, time.Second); out != OutcomeFailure || err != nil || !strings.Contains(msg, "connection refused") {
		t.Errorf("tcp to a closed port: %s %q %v, want a failure", out, msg, err)
	}
	for _, tc := range []struct {
		name, service string
		port          int
		want          Outcome
		msg           string
	}{
		{"serving", "up", port, OutcomeSuccess, "service healthy"},
		{"not serving", "down", port, OutcomeFailure, `service unhealthy (responded with "NOT_SERVING")`},
		{"no health service", "", barePort, OutcomeFailure, "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"},
		{"nothing listening", "", closedPort, OutcomeFailure, fmt.Sprintf("timeout: failed to connect service %q within 1s", net.JoinHostPort("127.0.0.1", strconv.Itoa(closedPort)))},
	} {
		out, msg, err := GRPCProbe(ctx, "127.0.0.1", tc.service, tc.port, time.Second)
		if out != tc.want || err != nil || !strings.HasPrefix(msg, tc.msg) {
			t.Errorf("%s: %s %q %v, want %s %q", tc.name, out, msg, err, tc.want, tc.msg)
		}
	}
}
