// Package procfs reads what dpkit needs of Linux's /proc: the processes
// and their stat fields, the mount table and the cgroup hierarchies, and
// removes cgroup trees. Written once for the process backend, the test
// node and the CI's leftover check.
package procfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// PIDs lists the processes (the numeric entries of /proc), in order.
func PIDs() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// Stat is /proc/PID/stat from field 3 (state) on: the fields after the
// command name, which may hold spaces and parentheses. Stat[i] is field
// i+3 of proc(5).
type Stat []string

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return Stat(f), nil
}

// State is the process state (R, S, D, Z, X, ...).
func (s Stat) State() byte { return s[0][0] }

// Exited reports whether the process has ended and waits only to be
// reaped (a zombie): it holds nothing any more.
func (s Stat) Exited() bool { return s.State() == 'Z' || s.State() == 'X' }

// Exiting reports whether the process has begun to exit (the kernel's
// PF_EXITING in field 9, set before its state turns to zombie).
func (s Stat) Exiting() bool { return s.Exited() || s.uint(6)&pfExiting != 0 }

// pfExiting is PF_EXITING of the kernel's include/linux/sched.h.
const pfExiting = 0x4

// PPID is the parent's PID (field 4).
func (s Stat) PPID() int { return s.int(1) }

// PGRP is the process group (field 5).
func (s Stat) PGRP() int { return s.int(2) }

// Session is the session ID (field 6).
func (s Stat) Session() int { return s.int(3) }

// StartTicks is the start time in clock ticks since boot (field 22): it
// tells a process from a later one that reuses its PID.
func (s Stat) StartTicks() uint64 { return s.uint(19) }

// CPUTicks is the user and system time spent, in clock ticks (fields 14
// and 15; USER_HZ, 100 on every Linux architecture Go supports).
func (s Stat) CPUTicks() uint64 { return s.uint(11) + s.uint(12) }

// RSSPages is the resident set size in pages (field 24).
func (s Stat) RSSPages() uint64 {
	if len(s) < 22 {
		return 0
	}
	return s.uint(21)
}

func (s Stat) uint(i int) uint64 {
	n, _ := strconv.ParseUint(s[i], 10, 64)
	return n
}

func (s Stat) int(i int) int {
	n, _ := strconv.Atoi(s[i])
	return n
}

// Mount is one line of /proc/self/mountinfo.
type Mount struct {
	Point  string // where it is mounted
	FSType string
	Source string
}

// Mounts reads this process's mount table.
func Mounts() ([]Mount, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []Mount
	for _, line := range strings.Split(string(b), "\n") {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, p := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(p) < 2 {
			continue
		}
		out = append(out, Mount{Point: unescape(f[4]), FSType: p[0], Source: unescape(p[1])})
	}
	return out, nil
}

// CgroupMounts returns the mount points of the cgroup hierarchies (v1 and
// v2), each once.
func CgroupMounts() ([]string, error) {
	ms, err := Mounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if (m.FSType == "cgroup" || m.FSType == "cgroup2") && !slices.Contains(out, m.Point) {
			out = append(out, m.Point)
		}
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RemoveTree removes dir and every directory below it, deepest first, as
// a cgroup tree is removed (rmdir, each empty of processes). A missing
// directory is no error; each one that could not be removed is named.
func RemoveTree(dir string) error {
	var all []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			all = append(all, p)
		}
		return nil
	})
	var errs []error
	for i := len(all) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(all[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", all[i], err))
		}
	}
	return errors.Join(errs...)
}
