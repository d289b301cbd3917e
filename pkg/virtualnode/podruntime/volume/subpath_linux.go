package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dpkit/dpkit/internal/procfs"
)

// openSubPath opens sub below the volume at volume as the kubelet does
// for a subPath (subpath_linux.go): links are resolved once and must stay
// within the volume, then every component is opened from its opened
// parent with O_NOFOLLOW, so a link the pod swaps in meanwhile is refused
// rather than followed; missing directories are made the same way
// (mkdirat from the opened parent), with perm. It returns a descriptor of
// the subPath (O_PATH: a FIFO or a device is not opened for I/O) that
// names the inode whatever the path holds later.
func openSubPath(volume, sub string, perm fs.FileMode) (int, error) {
	base, err := filepath.EvalSymlinks(volume)
	if err != nil {
		return -1, err
	}
	// The longest part of sub that exists, resolved: it must stay in the
	// volume. What is left is made.
	rel, missing, err := resolveWithin(base, filepath.Clean(sub))
	if err != nil {
		return -1, err
	}
	fd, err := unix.Open(base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	parts := append(splitPath(rel), missing...)
	for i, name := range parts {
		last := i == len(parts)-1
		create := i >= len(parts)-len(missing)
		if create {
			if err := unix.Mkdirat(fd, name, uint32(perm.Perm())); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(fd)
				return -1, fmt.Errorf("creating %s: %w", name, err)
			}
		}
		flags := unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if last {
			flags = unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		}
		next, err := unix.Openat(fd, name, flags, 0)
		unix.Close(fd)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, fmt.Errorf("%s changed to a link while it was opened: refused", filepath.Join(append([]string{volume}, parts[:i+1]...)...))
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	if len(parts) == 0 {
		// subPath "." is the volume itself.
		next, err := unix.Openat(fd, ".", unix.O_PATH|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		return next, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		unix.Close(fd)
		return -1, fmt.Errorf("%s changed to a link while it was opened: refused", filepath.Join(volume, sub))
	}
	return fd, nil
}

// resolveWithin resolves the links of the longest existing prefix of sub
// below base and returns it relative to base, with the components that
// do not exist yet. A prefix that resolves outside base is an error.
func resolveWithin(base, sub string) (string, []string, error) {
	parts := splitPath(sub)
	for n := len(parts); n >= 0; n-- {
		p := filepath.Join(append([]string{base}, parts[:n]...)...)
		resolved, err := filepath.EvalSymlinks(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", nil, err
		}
		rel, err := filepath.Rel(base, resolved)
		if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
			return "", nil, fmt.Errorf("subpath %q not within volume path %q", resolved, base)
		}
		if rel == "." {
			rel = ""
		}
		return rel, parts[n:], nil
	}
	return "", parts, nil
}

func splitPath(p string) []string {
	var out []string
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			out = append(out, s)
		}
	}
	return out
}

// bindSubPath bind-mounts the inode open as fd at target, which it makes
// (a directory or an empty file, as the source is): the runtime is given
// target, a path with no component the pod controls, and the kernel binds
// what was opened, not what the path resolves to now. A target mounted
// before (a container started again) is unmounted first.
func bindSubPath(fd int, target string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	if err := unmountAll(target); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := os.Mkdir(target, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	} else {
		f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o640)
		if err != nil {
			return err
		}
		_ = f.Close()
	}
	src := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting the subPath at %s (the node needs root for subPath, as the kubelet): %w", target, err)
	}
	return nil
}

// unmountSubPaths unmounts what bindSubPath mounted under a pod's
// directory (<pod>/volume-subpaths/<volume>/<container>/<index>).
func unmountSubPaths(podDir string) error {
	return unmountAll(filepath.Join(podDir, subPathDir))
}

// unmountAll detaches every mount at or below dir, deepest first, from the
// mount table (a bind mount from the same filesystem shares its device
// number, so only the table tells it is one).
func unmountAll(dir string) error {
	ms, err := procfs.Mounts()
	if err != nil {
		return err
	}
	var points []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			points = append(points, m.Point)
		}
	}
	// Deepest first; a point mounted twice is unmounted twice.
	slices.SortStableFunc(points, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}
