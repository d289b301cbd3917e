package httpserve_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/httpserve"
)

func TestServeUntilCanceled(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- httpserve.Serve(ctx, &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}, l) }()

	resp, err := http.Get("http://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "ok" {
		t.Fatalf("body = %q, want ok", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve after cancel = %v, want nil", err)
	}
	if _, err := http.Get("http://" + l.Addr().String() + "/"); err == nil {
		t.Fatal("server still answers after its context ended")
	}
}

func TestServeReturnsListenerError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	err = httpserve.Serve(context.Background(), &http.Server{ReadHeaderTimeout: time.Second}, l)
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve on a closed listener = %v, want the accept error", err)
	}
}

// TestServeIdleTimeout: a server with no IdleTimeout gets the kubelet's
// 90 s; an idle keep-alive connection is then closed by the server (shown
// with a short one).
func TestServeIdleTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- httpserve.Serve(ctx, srv, l) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if srv.IdleTimeout != httpserve.IdleTimeout || httpserve.IdleTimeout != 90*time.Second {
		t.Fatalf("IdleTimeout %v, want the kubelet's 90s", srv.IdleTimeout)
	}

	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer func() { cancel(); <-done }()
	go func() {
		done <- httpserve.Serve(ctx, &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second, IdleTimeout: 100 * time.Millisecond}, l)
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("the idle connection was not closed by the server: %v", err)
	}
}
