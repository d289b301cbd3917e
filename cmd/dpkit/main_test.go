package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestClosedOutputPipe runs "dpkit up" with its output read by a reader
// that goes away after the first lines, as "dpkit up | head" does, then
// stops it: the process must survive the closed pipe and remove its
// temporary root on the way out.
func TestClosedOutputPipe(t *testing.T) {
	if testing.Short() {
		t.Skip("builds dpkit")
	}
	bin := filepath.Join(t.TempDir(), "dpkit")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	tmp := t.TempDir()
	cmd := exec.Command(bin, "up")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read up to the line that says it is ready, then close the pipe.
	sc := bufio.NewScanner(stdout)
	ready := false
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ready:") {
			ready = true
			break
		}
	}
	_ = stdout.Close()
	if !ready {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("dpkit up never said ready; stderr:\n%s", stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		t.Fatalf("dpkit up was killed by %v after its output pipe closed; stderr:\n%s", ws.Signal(), stderr.String())
	}
	if err != nil {
		t.Errorf("dpkit up: %v; stderr:\n%s", err, stderr.String())
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "dpkit-up-*"))
	if len(left) > 0 {
		t.Errorf("temporary root left behind: %v", left)
	}
}
