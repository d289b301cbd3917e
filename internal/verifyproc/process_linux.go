package verifyproc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// parentDeathSignal has the kernel kill the process with SIGKILL when
// verify dies, even of SIGKILL, so that no plugin or driver outlives its
// run. It reaches the process verify starts, not the processes that one
// forks: those get no signal of their parent's death (dpkit verify --dra
// --cleanup finds them by the run in their environment).
func parentDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }

// startInPrivateMount starts cmd in a new mount namespace in which dst is
// a bind mount of src. It must be called on a locked OS thread that is
// never unlocked (the thread is discarded when its goroutine ends): the
// thread unshares its own mount namespace and makes the mounts there, so
// the verifier's namespace is never touched, and the child gets a copy of
// that namespace (CLONE_NEWNS).
func startInPrivateMount(cmd *exec.Cmd, src, dst string) error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	// Keep the mounts below out of the host's namespace.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := os.MkdirAll(dst, 0o750); err != nil {
		return fmt.Errorf("create %s: %w", dst, err)
	}
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mount %s on %s: %w", src, dst, err)
	}
	cmd.SysProcAttr.Cloneflags |= syscall.CLONE_NEWNS
	return cmd.Start()
}

// listeningSockets returns the paths of the unix sockets that the
// processes of process group pgid listen on, from /proc: the socket inodes
// among their file descriptors, looked up in /proc/net/unix. Abstract
// sockets are left out. ok is false when /proc could not be read.
func listeningSockets(pgid int) (paths []string, ok bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	inodes := map[string]bool{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || processGroup(pid) != pgid {
			continue
		}
		fds, err := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name()))
			if inode, found := strings.CutPrefix(link, "socket:["); err == nil && found {
				inodes[strings.TrimSuffix(inode, "]")] = true
			}
		}
	}
	data, err := os.ReadFile("/proc/net/unix")
	if err != nil {
		return nil, false
	}
	// Num RefCount Protocol Flags Type St Inode Path
	lines := strings.Split(string(data), "\n")
	for _, line := range lines[min(1, len(lines)):] {
		f := strings.Fields(line)
		if len(f) < 8 || !inodes[f[6]] || strings.HasPrefix(f[7], "@") {
			continue
		}
		const acceptCon = 0x10000 // __SO_ACCEPTCON: a listening socket
		if flags, err := strconv.ParseUint(f[3], 16, 32); err == nil && flags&acceptCon != 0 {
			paths = append(paths, strings.Join(f[7:], " "))
		}
	}
	sort.Strings(paths)
	return slices.Compact(paths), true
}

// processGroup returns the process group of pid from /proc/<pid>/stat, or
// -1.
func processGroup(pid int) int {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return -1
	}
	// pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 3 {
		return -1
	}
	pgrp, err := strconv.Atoi(f[2])
	if err != nil {
		return -1
	}
	return pgrp
}
