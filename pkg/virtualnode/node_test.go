package virtualnode

import (
	"net"
	"testing"
)

// TestDefaultNodeIP checks the default node IP is an address the node API
// can listen on: one of this machine's, or 127.0.0.1.
func TestDefaultNodeIP(t *testing.T) {
	ip := net.ParseIP(DefaultNodeIP())
	if ip == nil {
		t.Fatalf("DefaultNodeIP() = %q, not an IP address", DefaultNodeIP())
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatalf("cannot listen on the default node IP %s: %v", ip, err)
	}
	l.Close()
}
