package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
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
