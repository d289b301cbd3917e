package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/internal/procfs"
)

// RemoveAllPods stops and removes every pod sandbox of the CRI runtime at
// socket, as `crictl rmp -fa` does (stopping a sandbox kills its
// containers at once; a removal refused while a container's start is under
// way is tried again until ctx ends), and fails naming the sandboxes still
// listed after.
// Run it when no kubelet is left to start them again.
func RemoveAllPods(ctx context.Context, socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("remove pods: %w", err)
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("remove pods: list sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range resp.Items {
		if err := removeSandbox(ctx, rt, sb); err != nil {
			errs = append(errs, err)
		}
	}
	left, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("remove pods: list sandboxes: %w", err))...)
	}
	if len(left.Items) == 0 {
		return nil
	}
	var names []string
	for _, sb := range left.Items {
		names = append(names, fmt.Sprintf("%s (%s/%s, %s)", sb.Id, sb.Metadata.GetNamespace(), sb.Metadata.GetName(), sb.State))
	}
	return errors.Join(append(errs, fmt.Errorf("remove pods: sandboxes still there: %s", strings.Join(names, ", ")))...)
}

// removeRetry is how often removeSandbox tries again.
const removeRetry = 200 * time.Millisecond

// removeSandbox stops and removes one sandbox. A runtime refuses to remove
// a container while a start of it is still under way ("container is in
// starting state": a node stopped while it restarted a container), so
// it tries again until ctx ends and returns the last refusal.
func removeSandbox(ctx context.Context, rt runtimeapi.RuntimeServiceClient, sb *runtimeapi.PodSandbox) error {
	tick := time.NewTicker(removeRetry)
	defer tick.Stop()
	for {
		_, stopErr := rt.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id})
		_, err := rt.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id})
		if err == nil {
			return nil
		}
		if stopErr != nil {
			err = errors.Join(fmt.Errorf("stop: %w", stopErr), err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove sandbox %s (%s/%s): %w", sb.Id, sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err)
		case <-tick.C:
		}
	}
}

// ProcessMatcher says whether a process (by PID) is one to end.
type ProcessMatcher func(pid int) bool

// InCgroupTrees matches processes in any cgroup at or below the given
// directories (absolute paths under a cgroup mount, one per hierarchy).
func InCgroupTrees(dirs ...string) ProcessMatcher {
	return func(pid int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			return false
		}
		for _, d := range dirs {
			// The line of the hierarchy d belongs to ends with d's path
			// below its mount; any hierarchy will do, so compare the
			// path below the mount with each line's.
			rel := cgroupRelPath(d)
			if rel == "" {
				continue
			}
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				parts := strings.SplitN(line, ":", 3)
				if len(parts) == 3 && (parts[2] == rel || strings.HasPrefix(parts[2], rel+"/")) {
					return true
				}
			}
		}
		return false
	}
}

// cgroupRelPath returns d's path below its cgroup mount ("/dpkit-node-x"
// for "/sys/fs/cgroup/cpu/dpkit-node-x"), or "" when d is under none.
func cgroupRelPath(d string) string {
	mounts, err := procfs.CgroupMounts()
	if err != nil {
		return ""
	}
	best := ""
	for _, m := range mounts {
		if (d == m || strings.HasPrefix(d, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	if best == "" {
		return ""
	}
	rel := strings.TrimPrefix(d, best)
	if rel == "" {
		return "/"
	}
	return rel
}

// InMountNamespaceOf matches the processes, other than holder, that share
// holder's mount namespace: what a node's containerd started in it (its
// shims) outlives containerd.
func InMountNamespaceOf(holder int) ProcessMatcher {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", holder))
	return func(pid int) bool {
		if err != nil || pid == holder {
			return false
		}
		got, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		return err == nil && got == ns
	}
}

// WithArg matches processes whose command line has arg as one argument
// (a containerd shim's "-address SOCKET" names its containerd).
func WithArg(arg string) ProcessMatcher {
	return func(pid int) bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		return err == nil && slices.Contains(strings.Split(string(b), "\x00"), arg)
	}
}

// AnyOf matches what any of ms matches.
func AnyOf(ms ...ProcessMatcher) ProcessMatcher {
	return func(pid int) bool {
		for _, m := range ms {
			if m(pid) {
				return true
			}
		}
		return false
	}
}

// EndProcesses kills (SIGKILL) every live process match selects, again as
// long as new ones appear (a shim may start a process while it dies), and
// waits until none is left. It returns a description of each process it
// killed ("PID command line"), and an error naming those still alive when
// ctx ends. The calling process is never matched.
func EndProcesses(ctx context.Context, match ProcessMatcher) ([]string, error) {
	var killed []string
	seen := map[int]bool{}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		live := matching(match)
		if len(live) == 0 {
			return killed, nil
		}
		for _, pid := range live {
			if !seen[pid] {
				seen[pid] = true
				killed = append(killed, describeProcess(pid))
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		select {
		case <-ctx.Done():
			var left []string
			for _, pid := range matching(match) {
				left = append(left, describeProcess(pid))
			}
			if len(left) == 0 {
				return killed, nil
			}
			return killed, fmt.Errorf("processes still alive after SIGKILL: %s", strings.Join(left, "; "))
		case <-tick.C:
		}
	}
}

// matching lists the live (not zombie) processes match selects.
func matching(match ProcessMatcher) []int {
	self := os.Getpid()
	var out []int
	for _, pid := range procfs.PIDs() {
		if pid == self {
			continue
		}
		if ended(pid) {
			continue
		}
		if match(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// ended reports whether pid has ended with every thread of it: a zombie
// waiting only to be reaped. A thread group leader that has exited while
// other threads of its process run on (a multithreaded process killed:
// its threads end one by one) is a zombie too, but its process still
// holds its cgroups: removing them fails (EBUSY) until the last thread
// has gone.
func ended(pid int) bool {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return true
	}
	if !st.Exited() {
		return false
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return err != nil || len(tasks) <= 1
}

func describeProcess(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return strconv.Itoa(pid)
	}
	return strconv.Itoa(pid) + " " + strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// RemoveCgroupTreesWhenEmpty is RemoveCgroupTrees for cgroups whose
// processes were just ended: while a removal fails, it kills whatever the
// cgroups' own task lists still name (the kernel's word: a thread /proc
// shows in another cgroup, one still exiting) and tries again until ctx
// ends. It returns the tasks it found that way, each with its state, and
// an error naming those still listed.
func RemoveCgroupTreesWhenEmpty(ctx context.Context, dirs ...string) ([]string, error) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var found []string
	seen := map[int]bool{}
	for {
		err := RemoveCgroupTrees(dirs...)
		if err == nil {
			return found, nil
		}
		for _, tid := range cgroupTasks(dirs) {
			if !seen[tid] {
				seen[tid] = true
				found = append(found, describeTask(tid))
			}
			_ = syscall.Kill(tid, syscall.SIGKILL) // its whole process
		}
		select {
		case <-ctx.Done():
			var names []string
			for _, tid := range cgroupTasks(dirs) {
				names = append(names, describeTask(tid))
			}
			return found, fmt.Errorf("%w; tasks the cgroups still list: %v", err, names)
		case <-tick.C:
		}
	}
}

// cgroupTasks lists the thread IDs in each directory's cgroup tree, as
// the cgroups list them (tasks in cgroup v1, cgroup.threads in v2).
func cgroupTasks(dirs []string) []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, rerr := os.ReadFile(filepath.Join(p, "tasks"))
			if rerr != nil {
				b, _ = os.ReadFile(filepath.Join(p, "cgroup.threads"))
			}
			for _, f := range strings.Fields(string(b)) {
				if tid, err := strconv.Atoi(f); err == nil && !seen[tid] {
					seen[tid] = true
					out = append(out, tid)
				}
			}
			return nil
		})
	}
	return out
}

// describeTask names a thread: its ID, its process's, its state and
// command line.
func describeTask(tid int) string {
	st, err := procfs.ReadStat(tid)
	if err != nil {
		return fmt.Sprintf("%d (gone)", tid)
	}
	tgid := tid
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
				tgid, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
	}
	return fmt.Sprintf("thread %d of %s, state %s", tid, describeProcess(tgid), string(st.State()))
}

// RemoveCgroupTrees removes each directory and every cgroup below it,
// deepest first. A cgroup that still holds a process cannot be removed:
// end them first (EndProcesses with InCgroupTrees).
func RemoveCgroupTrees(dirs ...string) error {
	var errs []error
	for _, d := range dirs {
		if err := procfs.RemoveTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
