// Package devfs reads device nodes below a dev root.
//
// Paths come in two forms: host paths, which always start with /dev/ and
// are what the kubelet and the container runtime see, and local paths,
// which are where this process finds them (the dev root, such as /host/dev
// in a container or a fixture tree in a test, joined with the rest).
package devfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/dpkit/dpkit/internal/natural"
)

// HostDev is the host's device directory; host paths start with it.
const HostDev = "/dev"

// ErrNotBelowDev is returned for host paths that are not below /dev.
var ErrNotBelowDev = errors.New("path is not below /dev")

// Local returns where the process finds host path hostPath given the dev
// root. hostPath must be below /dev.
func Local(root, hostPath string) (string, error) {
	rel, err := Rel(hostPath)
	if err != nil {
		return "", err
	}
	return filepath.Join(root, rel), nil
}

// Rel returns hostPath relative to /dev.
func Rel(hostPath string) (string, error) {
	clean := path.Clean(hostPath)
	rel, ok := strings.CutPrefix(clean, HostDev+"/")
	if !ok || rel == "" || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%q: %w", hostPath, ErrNotBelowDev)
	}
	return rel, nil
}

// Host returns the host path of a path relative to /dev.
func Host(rel string) string { return path.Join(HostDev, rel) }

// Glob returns the host paths below /dev that match pattern (a host path
// with filepath.Match wildcards, such as /dev/ttyUSB*), naturally sorted
// (ttyUSB2 before ttyUSB10). A pattern without wildcards matches itself
// when it exists.
func Glob(root, pattern string) ([]string, error) {
	rel, err := Rel(pattern)
	if err != nil {
		return nil, err
	}
	matches, err := filepath.Glob(filepath.Join(root, rel))
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	out := make([]string, 0, len(matches))
	for _, m := range matches {
		r, err := filepath.Rel(root, m)
		if err != nil {
			continue
		}
		out = append(out, Host(filepath.ToSlash(r)))
	}
	SortNatural(out)
	return out, nil
}

// HasMeta reports whether a pattern has glob wildcards.
func HasMeta(pattern string) bool { return strings.ContainsAny(pattern, `*?[\`) }

// Node is what the process knows of one device node.
type Node struct {
	// Path is the host path, such as /dev/ttyUSB0.
	Path string
	// Exists reports whether the node (or what its symlink points to)
	// exists.
	Exists bool
	// Accessible reports whether the node exists, is a device node or a
	// regular file (fixture trees hold regular files) and this process may
	// read it.
	Accessible bool
	// Char and Block report the node type; both are false for regular
	// files. Dir is true for a directory (never accessible).
	Char, Block, Dir bool
	// Major and Minor are the device numbers of a char or block node.
	Major, Minor uint32
	// Denied reports a device node, or regular file, that this process
	// may not read: its file mode, or the device cgroup of the container
	// the process runs in (an unprivileged plugin container may see
	// /dev/fuse and not open it). Err says which. It says nothing of the
	// device: a container the device is allocated to gets access from its
	// runtime.
	Denied bool
	// Err says why the node is not accessible.
	Err error
}

// Stat inspects host path hostPath below root without opening it: opening
// some devices has side effects (a serial port raises DTR, a GPU
// initializes).
func Stat(root, hostPath string) Node {
	n := Node{Path: hostPath}
	local, err := Local(root, hostPath)
	if err != nil {
		n.Err = err
		return n
	}
	fi, err := os.Stat(local)
	if err != nil {
		n.Err = err
		return n
	}
	n.Exists = true
	mode := fi.Mode()
	switch {
	case mode&fs.ModeCharDevice != 0:
		n.Char = true
	case mode&fs.ModeDevice != 0:
		n.Block = true
	case mode.IsRegular():
	default:
		n.Dir = mode.IsDir()
		n.Err = fmt.Errorf("%s is a %s, not a device node", hostPath, typeName(mode))
		return n
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (n.Char || n.Block) {
		n.Major, n.Minor = splitDev(uint64(st.Rdev))
	}
	if err := access(local, 4 /* R_OK */); err != nil {
		n.Err = fmt.Errorf("%s is not readable: %w", hostPath, err)
		n.Denied = errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES)
		return n
	}
	n.Accessible = true
	return n
}

// access is syscall.Access; tests replace it.
var access = syscall.Access

// splitDev decodes a Linux dev_t.
func splitDev(dev uint64) (major, minor uint32) {
	major = uint32((dev & 0x00000000000fff00) >> 8)
	major |= uint32((dev & 0xfffff00000000000) >> 32)
	minor = uint32((dev & 0x00000000000000ff) >> 0)
	minor |= uint32((dev & 0x00000ffffff00000) >> 12)
	return major, minor
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	default:
		return "special file"
	}
}

// SortNatural sorts strings so that runs of digits compare by value:
// ttyUSB2 < ttyUSB10, renderD128 < renderD129.
func SortNatural(s []string) { natural.Sort(s) }
