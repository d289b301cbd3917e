//go:build linux

package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dpkit/dpkit/internal/procfs"
)

// testScope owns mounts under dir and top-level cgroups named prefix*,
// so the test never touches what other packages' tests run beside it.
func testScope(dir, prefix string) scope {
	return scope{self: os.Getpid(), mountRoot: dir, cgroupOwned: func(rel string) bool {
		return strings.HasPrefix(strings.TrimPrefix(rel, "/"), prefix)
	}}
}

func runTest(t *testing.T, sc scope, script string, flags ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	args := append(append([]string{"-grace", "300ms"}, flags...), "--", "sh", "-c", script)
	code := runIn(sc, args, &out, &errb)
	return code, out.String() + errb.String()
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func alive(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && !st.Exited() && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		script   string // $D is a fresh directory
		wantCode int
		want     string // in the report; "" for a clean run
	}{
		{name: "clean", script: "echo hi", wantCode: 0},
		{name: "orphan ignoring SIGTERM", script: `sh -c 'trap "" TERM; exec sleep 300' & echo $! > $D/pid`, wantCode: 1, want: "sleep 300"},
		{name: "orphan of a failed command keeps the command's status", script: `sleep 301 & echo $! > $D/pid; exit 3`, wantCode: 3, want: "sleep 301"},
		{name: "grandchild whose parent ended", script: `sh -c 'sleep 302 & echo $! > $D/pid' & wait`, wantCode: 1, want: "sleep 302"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			code, out := runTest(t, testScope(d, "none"), strings.ReplaceAll(tc.script, "$D", d))
			if code != tc.wantCode {
				t.Errorf("exit status %d, want %d; output:\n%s", code, tc.wantCode, out)
			}
			if tc.want == "" {
				if !strings.Contains(out, "left no process") {
					t.Errorf("a clean run reported:\n%s", out)
				}
				return
			}
			if !strings.Contains(out, "process ") || !strings.Contains(out, tc.want) || !strings.Contains(out, "ended the processes that descend from the command") {
				t.Errorf("report does not name %q and end it:\n%s", tc.want, out)
			}
			if pid := readPID(t, filepath.Join(d, "pid")); alive(pid) {
				t.Errorf("pid %d still alive after the report", pid)
			}
		})
	}
}

func TestLeftoverMountAndCgroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting and making cgroups needs root")
	}
	hier := ""
	for _, m := range []string{"/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(m, "cgroup.procs")); err == nil {
			hier = m
			break
		}
	}
	if hier == "" {
		t.Skip("no cgroup hierarchy found")
	}
	d := t.TempDir()
	prefix := "dpkit-leftovers-test-" + strconv.Itoa(os.Getpid())
	cg := filepath.Join(hier, prefix)
	t.Cleanup(func() { _ = os.Remove(cg); _ = syscall.Unmount(filepath.Join(d, "m"), syscall.MNT_DETACH) })
	script := `set -e; mkdir -p $D/m; mount -t tmpfs leftovers-test $D/m; mkdir -p ` + cg + `
sleep 303 & echo $! > $D/pid; echo $! > ` + cg + `/cgroup.procs`

	// Without -clean: named, the process (its own) ended, the mount and
	// the cgroup left, since another run on the machine could own them.
	code, out := runTest(t, testScope(d, prefix), strings.ReplaceAll(script, "$D", d))
	if code != 1 || !strings.Contains(out, "mount   "+filepath.Join(d, "m")) || !strings.Contains(out, "cgroup  "+cg) {
		t.Errorf("without -clean: exit %d, output:\n%s\nwant the mount and the cgroup named", code, out)
	}
	if _, err := os.Stat(cg); err != nil {
		t.Errorf("without -clean the cgroup was removed: %v", err)
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); !strings.Contains(string(m), filepath.Join(d, "m")+" ") {
		t.Error("without -clean the mount was detached")
	}
	if err := syscall.Unmount(filepath.Join(d, "m"), syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(cg); err != nil {
		t.Fatal(err)
	}

	code, out = runTest(t, testScope(d, prefix), strings.ReplaceAll(script, "$D", d), "-clean")
	if code != 1 {
		t.Errorf("exit status %d, want 1; output:\n%s", code, out)
	}
	for _, want := range []string{"mount   " + filepath.Join(d, "m"), "cgroup  " + cg, "sleep 303", "ended them"} {
		if !strings.Contains(out, want) {
			t.Errorf("report has no %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("cgroup %s still there: %v", cg, err)
	}
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), filepath.Join(d, "m")+" ") {
		t.Errorf("mount %s still there", filepath.Join(d, "m"))
	}
}
