package verifyproc_test

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/procfs"
)

// TestProcessDiesWithVerify: a command verify runs (a plugin, a DRA
// driver) dies when verify is killed with SIGKILL, which verify cannot
// catch: the kernel sends it the parent-death signal.
func TestProcessDiesWithVerify(t *testing.T) {
	t.Parallel()
	helper := filepath.Join(t.TempDir(), "startprocess")
	build := exec.Command("go", "build", "-o", helper, "./internal/verifyproc/testdata/startprocess")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(helper, "sleep", "300")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the command's PID: %q, %v, %v", line, err, perr)
	}
	// Some time running first: the thread that started it must be
	// there as long as verify is (the signal comes when it ends).
	time.Sleep(200 * time.Millisecond)
	if st, err := procfs.ReadStat(pid); err != nil || st.Exited() {
		t.Fatalf("the command (pid %d) ended before verify: %v, %v", pid, st, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := procfs.ReadStat(pid)
		if err != nil || st.Exited() {
			return
		}
		if time.Now().After(deadline) {
			_ = exec.Command("kill", "-9", strconv.Itoa(pid)).Run()
			t.Fatalf("the command (pid %d) still runs 10s after verify was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
