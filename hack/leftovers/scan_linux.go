//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dpkit/dpkit/internal/procfs"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (linux/prctl.h).
const prSetChildSubreaper = 36

func becomeSubreaper() error {
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", e)
	}
	return nil
}

// scope says what counts as the command's: processes below self (the
// subreaper), mounts whose mount point is under mountRoot, and cgroups
// that cgroupOwned selects by their path below a hierarchy's mount.
type scope struct {
	self        int
	mountRoot   string
	cgroupOwned func(rel string) bool
}

// machineScope is the whole machine: the cgroups a test node, the kubelet
// and a containerd without a cgroup parent make.
func machineScope() scope {
	return scope{self: os.Getpid(), mountRoot: "/", cgroupOwned: suiteCgroup}
}

// suiteCgroup selects the kubelet's and the test nodes' cgroups
// (test/controlplane makes "/dpkit-node-*" roots), and what a containerd
// run without a cgroup parent makes below "/k8s.io".
func suiteCgroup(rel string) bool {
	first, _, _ := strings.Cut(strings.TrimPrefix(rel, "/"), "/")
	switch {
	case strings.HasPrefix(first, "dpkit-"), strings.HasPrefix(first, "kubepods"):
		return true
	case first == "k8s.io":
		return rel != "/k8s.io"
	}
	return false
}

type snapshot struct {
	mounts  map[string]bool // "mount point\x00source"
	cgroups map[string]bool // absolute cgroup directories
}

func (s scope) snapshot() snapshot {
	return snapshot{mounts: toSet(s.mounts()), cgroups: toSet(s.cgroups())}
}

func toSet(xs []string) map[string]bool {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

// leftovers is what the command left.
type leftovers struct {
	procs   []proc
	mounts  []string // "mount point\x00source"
	cgroups []string
}

type proc struct {
	pid  int
	desc string
	// below says the process descends from the command (the subreaper
	// found it); the others were found in the suite's cgroups.
	below bool
}

func (l leftovers) empty() bool {
	return len(l.procs) == 0 && len(l.mounts) == 0 && len(l.cgroups) == 0
}

func (l leftovers) String() string {
	var b strings.Builder
	for _, p := range l.procs {
		fmt.Fprintf(&b, "  process %s\n", p.desc)
	}
	for _, m := range l.mounts {
		point, src, _ := strings.Cut(m, "\x00")
		fmt.Fprintf(&b, "  mount   %s (from %s)\n", point, src)
	}
	for _, c := range l.cgroups {
		fmt.Fprintf(&b, "  cgroup  %s\n", filepath.Clean(c))
	}
	return b.String()
}

// find lists what is there now and was not in before: live processes
// below the subreaper or in the suite's cgroups, new mounts, new cgroups.
func (s scope) find(before snapshot) leftovers {
	var l leftovers
	cgroups := s.cgroups()
	var fresh []string
	for _, c := range cgroups {
		if !before.cgroups[c] {
			fresh = append(fresh, c)
		}
	}
	l.cgroups = fresh
	found := s.processes(cgroups)
	pids := slices.Sorted(maps.Keys(found))
	for _, pid := range pids {
		l.procs = append(l.procs, proc{pid: pid, desc: describe(pid), below: found[pid]})
	}
	for _, m := range s.mounts() {
		if !before.mounts[m] {
			l.mounts = append(l.mounts, m)
		}
	}
	return l
}

// processes lists the live processes below self and those in cgroups,
// each with whether it is below self (ancestry read once from /proc).
func (s scope) processes(cgroups []string) map[int]bool {
	parent := map[int]int{}
	for _, pid := range procfs.PIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && !st.Exited() {
			parent[pid] = st.PPID()
		}
	}
	out := map[int]bool{}
	for pid := range parent {
		if pid == s.self {
			continue
		}
		if b := below(parent, pid, s.self); b || inCgroups(pid, cgroups) {
			out[pid] = b
		}
	}
	return out
}

func below(parent map[int]int, pid, ancestor int) bool {
	for range len(parent) {
		p, ok := parent[pid]
		if !ok || p == 0 {
			return false
		}
		if p == ancestor {
			return true
		}
		pid = p
	}
	return false
}

// inCgroups reports whether pid is in one of the cgroup directories.
func inCgroups(pid int, dirs []string) bool {
	if len(dirs) == 0 {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return false
	}
	rels := map[string]bool{}
	for _, d := range dirs {
		if _, rel, ok := strings.Cut(d, cgroupSep); ok {
			rels["/"+rel] = true
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && rels[parts[2]] {
			return true
		}
	}
	return false
}

func describe(pid int) string {
	p := "/proc/" + strconv.Itoa(pid)
	cmd, _ := os.ReadFile(p + "/cmdline")
	line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	if line == "" {
		comm, _ := os.ReadFile(p + "/comm")
		line = "[" + strings.TrimSpace(string(comm)) + "]"
	}
	cwd, _ := os.Readlink(p + "/cwd")
	cg, _ := os.ReadFile(p + "/cgroup")
	var cgs []string
	for _, l := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		if parts := strings.SplitN(l, ":", 3); len(parts) == 3 && parts[2] != "/" && !slices.Contains(cgs, parts[2]) {
			cgs = append(cgs, parts[2])
		}
	}
	return fmt.Sprintf("%d %s (cwd %s; cgroups %s)", pid, line, cwd, strings.Join(cgs, ","))
}

// mounts lists "mount point\x00type:source" of every mount under
// mountRoot.
func (s scope) mounts() []string {
	ms, err := procfs.Mounts()
	if err != nil {
		return nil
	}
	var out []string
	for _, m := range ms {
		if s.mountRoot == "/" || strings.HasPrefix(m.Point, s.mountRoot+"/") {
			out = append(out, m.Point+"\x00"+m.FSType+":"+m.Source)
		}
	}
	return out
}

// cgroupSep joins a hierarchy's mount and a cgroup's path below it in
// the names cgroups returns ("/sys/fs/cgroup/cpu//dpkit-node-x"): the
// kernel takes the doubled slash as one, and the path below the mount is
// what /proc/PID/cgroup shows.
const cgroupSep = "//"

// cgroups lists the cgroup directories s owns, in every hierarchy.
func (s scope) cgroups() []string {
	roots, err := procfs.CgroupMounts()
	if err != nil {
		return nil
	}
	var out []string
	for _, root := range roots {
		_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || path == root {
				return nil
			}
			rel := strings.TrimPrefix(path, root)
			if s.cgroupOwned(rel) {
				out = append(out, root+cgroupSep+strings.TrimPrefix(rel, "/"))
				return nil
			}
			// Only the top two levels can start an owned tree.
			if strings.Count(rel, "/") >= 2 {
				return filepath.SkipDir
			}
			return nil
		})
	}
	return out
}

// end stops the processes that descend from the command (SIGTERM,
// SIGKILL after grace). With clean (the machine is the run's: CI) it also
// stops the other processes found, detaches the mounts (deepest first)
// and removes the cgroups (deepest first); without it those are only
// reported, since another run on the machine may own them.
func (s scope) end(ctx context.Context, l leftovers, grace time.Duration, clean bool) error {
	var errs []error
	if !clean {
		var own []proc
		for _, p := range l.procs {
			if p.below {
				own = append(own, p)
			}
		}
		l = leftovers{procs: own}
	}
	for _, p := range l.procs {
		_ = syscall.Kill(p.pid, syscall.SIGTERM)
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	killed := false
	for {
		// Reap what was reparented to this process.
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		var live []int
		for _, p := range l.procs {
			if st, err := procfs.ReadStat(p.pid); err == nil && !st.Exited() {
				live = append(live, p.pid)
			}
		}
		for pid, below := range s.processes(l.cgroups) {
			if !slices.Contains(live, pid) && (clean || below) {
				live = append(live, pid)
			}
		}
		if len(live) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			var left []string
			for _, pid := range live {
				left = append(left, describe(pid))
			}
			return errors.Join(append(errs, fmt.Errorf("still alive: %s", strings.Join(left, "; ")))...)
		case <-deadline.C:
			killed = true
		case <-tick.C:
		}
		if killed {
			for _, pid := range live {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	points := make([]string, 0, len(l.mounts))
	for _, m := range l.mounts {
		point, _, _ := strings.Cut(m, "\x00")
		points = append(points, point)
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", p, err))
		}
	}
	cgs := slices.Clone(l.cgroups)
	slices.SortFunc(cgs, func(a, b string) int { return len(b) - len(a) })
	for _, c := range cgs {
		if err := procfs.RemoveTree(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// reapOrphans waits for the exited children of this process but keep:
// processes reparented here (the subreaper) are reaped as they end,
// while keep's exit status stays for its own Wait.
func reapOrphans(keep int) {
	self := os.Getpid()
	for _, pid := range procfs.PIDs() {
		if pid == keep {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.PPID() == self && st.State() == 'Z' {
			_, _ = syscall.Wait4(pid, nil, syscall.WNOHANG, nil)
		}
	}
}
