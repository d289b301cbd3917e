// Package unixsock listens on unix sockets the way every dpkit server
// does: the socket's directory is created (0750), a stale socket left at
// the path by an earlier process is replaced, and any other file there is
// refused rather than deleted.
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
