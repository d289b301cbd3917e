// Package probes serves Prometheus metrics and liveness/readiness probes
// over HTTP: /metrics, /healthz and /readyz.
package probes

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dpkit/dpkit/internal/httpserve"
)

// Server is a running probe server.
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen binds addr (e.g. ":9400" or "127.0.0.1:0") and returns a server
// for the metrics in g and the readiness reported by ready (nil means
// ready). Call Serve to start it.
func Listen(addr string, g prometheus.Gatherer, ready func() error, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-address %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError)}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return &Server{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}}, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until ctx ends, then shuts down.
func (s *Server) Serve(ctx context.Context) error {
	return httpserve.Serve(ctx, s.srv, s.ln)
}
