// Package unixsock is how every dpkit server listens on a unix socket and
// every client dials one. Listen creates the socket's directory (0750),
// replaces a stale socket left at the path by an earlier process, and
// refuses any other file there rather than deleting it; NewGRPCClient and
// WaitReady dial a kubelet or plugin socket without transport security.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
)

// ErrNotSocket is returned when the path holds a file that is not a
// socket.
var ErrNotSocket = errors.New("exists and is not a socket")

// Listen listens on the unix socket at path. The error names path.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("creating the directory of %s: %w", path, err)
	}
	switch fi, err := os.Lstat(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	case fi.Mode()&fs.ModeSocket == 0:
		return nil, fmt.Errorf("%s %w; remove it or choose another path", path, ErrNotSocket)
	default:
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("removing the stale socket %s: %w", path, err)
		}
	}
	return net.Listen("unix", path)
}
