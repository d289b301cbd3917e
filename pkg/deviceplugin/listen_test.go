package deviceplugin

import (
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestListenUnixSocketRemovedAtOnce: a kubelet starting empties the device
// plugin directory; a socket removed right after it was made is made
// again, and the listener returned is the one on the file that exists.
func TestListenUnixSocketRemovedAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.sock")
	removals := 2
	afterListen = func(p string) {
		if removals > 0 {
			removals--
			_ = os.Remove(p)
		}
	}
	t.Cleanup(func() { afterListen = nil })
	ln, fi, err := listenUnix(path)
	if err != nil {
		t.Fatalf("listenUnix: %v", err)
	}
	defer ln.Close()
	now, err := os.Stat(path)
	if err != nil || !os.SameFile(now, fi) {
		t.Fatalf("socket file %v (%v) is not the one returned", now, err)
	}
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial the socket: %v", err)
	}
	c.Close()

	// Removed every time: an error naming the socket.
	afterListen = func(p string) { _ = os.Remove(p) }
	if _, _, err := listenUnix(filepath.Join(t.TempDir(), "q.sock")); err == nil {
		t.Fatal("no error when the socket is always removed")
	}
}
