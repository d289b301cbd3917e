package unixsock

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
)

func TestListen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()

	// The directory is created.
	sock := filepath.Join(dir, "a", "b.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("directory: %v, %v; want mode 0750", fi, err)
	}

	// A stale socket (left by a listener that did not unlink it) is replaced.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	l, err = Listen(sock)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	_ = l.Close()

	// Any other file is refused and kept.
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(regular); !errors.Is(err, ErrNotSocket) {
		t.Fatalf("Listen(regular file) = %v, want ErrNotSocket", err)
	}
	if data, err := os.ReadFile(regular); err != nil || string(data) != "keep" {
		t.Errorf("regular file changed: %q, %v", data, err)
	}
}

// A gRPC client of a socket served later connects once it is there, and
// WaitReady on a socket nobody serves ends with ctx, naming the state.
func TestGRPCClient(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "s.sock")
	conn, err := NewGRPCClient(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := WaitReady(ctx, conn); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last state") {
		t.Fatalf("WaitReady with nothing served = %v, want a deadline error naming the last state", err)
	}
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	conn2, err := NewGRPCClient(sock, QuickReconnect(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if err := WaitReady(ctx2, conn2); err != nil {
		t.Fatalf("WaitReady with the socket served: %v", err)
	}
}
