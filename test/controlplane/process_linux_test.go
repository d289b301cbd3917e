package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dpkit/dpkit/internal/procfs"
)

// TestProcessOutlivesTheThreadOfItsStarter: a goroutine that starts a
// process and then returns locked to its thread ends that thread, as
// dpkit verify's private mount does in the e2e tests' binary. The
// kernel sends the parent-death signal when the thread that forked the
// process ends, so the process must not have been forked from the
// caller's thread.
func TestProcessOutlivesTheThreadOfItsStarter(t *testing.T) {
	t.Parallel()
	type started struct {
		p      *process
		tid    int
		err    error
		onMain bool
	}
	logPath := filepath.Join(t.TempDir(), "sleep.log")
	var s started
	var holds []chan struct{}
	defer func() {
		for _, h := range holds {
			close(h)
		}
	}()
	for s.p == nil {
		ch, hold := make(chan started, 1), make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the runtime ends this thread
			if syscall.Gettid() == os.Getpid() {
				// The main thread, which the runtime never ends: keep
				// it, so that the next goroutine runs on another.
				ch <- started{onMain: true}
				<-hold
				runtime.UnlockOSThread()
				return
			}
			p, err := startSpec(procSpec{name: "sleep", path: "sleep", args: []string{"3600"}, logPath: logPath})
			ch <- started{p: p, tid: syscall.Gettid(), err: err}
		}()
		s = <-ch
		if s.onMain {
			holds = append(holds, hold)
			continue
		}
		if s.err != nil {
			t.Fatal(s.err)
		}
	}
	defer func() {
		if err := s.p.stop(0); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	task := fmt.Sprintf("/proc/self/task/%d", s.tid)
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		_, err := os.Stat(task)
		return errors.Is(err, os.ErrNotExist), nil
	}); err != nil {
		t.Fatalf("the starter's thread %d did not end: %v", s.tid, err)
	}
	// A parent-death signal, had the thread that ended forked the
	// process, has been sent by now: it is pending, or the process is
	// exiting or gone.
	if done, err := s.p.exited(); done {
		t.Fatalf("the process ended with the thread of the goroutine that started it: %v", err)
	}
	st, err := procfs.ReadStat(s.p.pid())
	if err != nil {
		t.Fatalf("the process ended with the thread of the goroutine that started it: %v", err)
	}
	if st.Exiting() || sigkillPending(t, s.p.pid()) {
		t.Fatalf("the process is being killed (state %c) since the thread of the goroutine that started it ended", st.State())
	}
}

// sigkillPending reports whether SIGKILL is pending for pid or its
// thread group (/proc/PID/status SigPnd, ShdPnd).
func sigkillPending(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return true // gone
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatalf("/proc/%d/status %s: %v", pid, k, err)
		}
		if mask&(1<<(syscall.SIGKILL-1)) != 0 {
			return true
		}
	}
	return false
}

// envLeaderExits makes the test binary a helper process for
// TestEndedWaitsForEveryThread: its main thread exits alone (exit(2), not
// exit_group(2)) while another thread of it runs on.
const envLeaderExits = "DPKIT_TEST_LEADER_EXITS"

func init() { //nolint:gochecknoinits // only init is sure to run on the main thread, the leader the helper ends alone
	if os.Getenv(envLeaderExits) != "1" {
		return
	}
	running := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		close(running)
		time.Sleep(time.Hour)
	}()
	<-running
	// init runs on the main thread, the thread group's leader.
	_, _, _ = syscall.RawSyscall(syscall.SYS_EXIT, 0, 0, 0)
}

// TestEndedWaitsForEveryThread: a process whose thread group leader has
// exited while another thread runs on shows as a zombie, yet still holds
// its cgroups; EndProcesses must not take it for ended.
func TestEndedWaitsForEveryThread(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envLeaderExits+"=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		st, err := procfs.ReadStat(pid)
		return err == nil && st.Exited(), nil
	}); err != nil {
		t.Fatalf("the helper's main thread did not exit: %v", err)
	}
	if ended(pid) {
		t.Fatal("a process whose leader has exited while another thread runs counts as ended")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
		return ended(pid), nil
	}); err != nil {
		t.Fatalf("the killed helper never counted as ended: %v", err)
	}
}
