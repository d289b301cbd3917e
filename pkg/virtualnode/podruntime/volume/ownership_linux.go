package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// groupTree gives everything below dir the group gid and adds the
// permission bits of mask (and, for directories, setgid and group search),
// the kubelet's SetVolumeOwnership, without following a link anywhere: the
// pod may write the tree (an emptyDir) while it is walked, and swap a file
// or a directory for a link to anywhere on the node. Each entry is opened
// relative to its opened parent with O_NOFOLLOW and changed through that
// descriptor, so what is changed is what was checked; a link itself only
// gets the group.
func groupTree(dir string, gid int, mask fs.FileMode) error {
	return walkGroup(dir, gid, mask, nil)
}

// walkGroup is groupTree; checked, when not nil, is called with each
// entry's path once the entry has been opened and checked, before it is
// changed (a test swaps the entry for a link there).
func walkGroup(dir string, gid int, mask fs.FileMode, checked func(path string)) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	w := groupWalk{gid: gid, mask: uint32(mask.Perm()), checked: checked}
	return w.entry(fd, dir)
}

type groupWalk struct {
	gid     int
	mask    uint32
	checked func(path string)
}

// entry changes the opened entry fd (named path, for errors) and, for a
// directory, what is below it. It closes fd.
func (w *groupWalk) entry(fd int, path string) error {
	gid, mask := w.gid, w.mask
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := unix.Fchownat(fd, "", -1, gid, unix.AT_EMPTY_PATH); err != nil {
		return fmt.Errorf("%s: chown: %w", path, err)
	}
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFLNK {
		return nil
	}
	if w.checked != nil {
		w.checked(path)
	}
	mode := st.Mode&0o7777 | mask
	if typ == unix.S_IFDIR {
		mode |= unix.S_ISGID | uint32(execMask)
	}
	// chmod through the descriptor's /proc link: it names the inode that
	// was opened, whatever the path holds now (fchmod does not take the
	// O_PATH descriptors that files are opened with here).
	if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode); err != nil {
		return fmt.Errorf("%s: chmod: %w", path, err)
	}
	if typ != unix.S_IFDIR {
		return nil
	}
	names, err := readNames(fd, path)
	if err != nil {
		return err
	}
	for _, name := range names {
		child := filepath.Join(path, name)
		cfd, err := unix.Openat(fd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			continue // removed meanwhile
		}
		if err != nil {
			return fmt.Errorf("%s: %w", child, err)
		}
		var cst unix.Stat_t
		if err := unix.Fstat(cfd, &cst); err != nil {
			unix.Close(cfd)
			return fmt.Errorf("%s: %w", child, err)
		}
		if cst.Mode&unix.S_IFMT == unix.S_IFDIR {
			if w.checked != nil {
				w.checked(child)
			}
			// Opened again to be read, from the same parent and again
			// without following a link: a link swapped in meanwhile is
			// refused (ELOOP, ENOTDIR), not walked into.
			unix.Close(cfd)
			cfd, err = unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%s: %w", child, err)
			}
		}
		if err := w.entry(cfd, child); err != nil {
			return err
		}
	}
	return nil
}

// readNames lists the directory open as fd, which stays open.
func readNames(fd int, path string) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d := os.NewFile(uintptr(dup), path)
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return names, nil
}
