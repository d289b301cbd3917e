package e2e

import (
	"bufio"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/testdir"
)

// TestUpProcess runs the built dpkit binary as "dpkit up" (no control
// plane needed), waits for its ready line, drives it with get, admit and
// delete as separate processes, then stops it with SIGTERM and checks that
// it exits 0 and leaves no socket behind.
func TestUpProcess(t *testing.T) {
	bin := dpkitBinary(t)
	ctx := testContext(t)
	root := testdir.Short(t, "e2eup")

	up := exec.CommandContext(ctx, bin, "up", "--root", root)
	up.Dir = filepath.Join("..", "..")                           // a checkout: the banner names examples/pod.yaml
	up.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir()) // where it records its root
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	up.Stderr = &logs
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var banner []string
	t.Cleanup(func() {
		_ = up.Process.Kill()
		for range lines {
		}
		if t.Failed() {
			t.Logf("dpkit up output:\n%s\nlogs:\n%s", strings.Join(banner, "\n"), logs.String())
		}
	})
	// next returns the next line, in order.
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("dpkit up ended before %s", what)
			}
			banner = append(banner, l)
			return l
		case <-ctx.Done():
			t.Fatalf("dpkit up printed no %s: %v", what, ctx.Err())
		}
		return ""
	}
	var commands []string
	for {
		l := next("ready line")
		if strings.HasPrefix(l, "ready:") {
			if l != "ready: example.com/foo=8 allocatable" {
				t.Errorf("ready line %q", l)
			}
			break
		}
	}
	for {
		l := next("end of the banner")
		if l == "Stop with Ctrl-C." {
			break
		}
		if strings.HasPrefix(l, "  ") {
			commands = append(commands, strings.TrimSpace(l))
		}
	}

	// The printed commands are what a user pastes: run them as printed.
	want := []struct {
		args string
		code int
		out  []string
	}{
		{"get resources --root R", 0, []string{`(?m)^example\.com/foo +8 +8 +0 +true$`}},
		{"admit --root R -f examples/pod.yaml", 0, []string{
			`(?m)^pod default/demo admitted`,
			`(?m)^setup +init +example\.com/foo: dev-\d +env DPKIT_FAKE_DEVICES=dev-\d$`,
			`(?m)^main +app +example\.com/foo: dev-\d,dev-\d +env DPKIT_FAKE_DEVICES=dev-\d,dev-\d$`}},
		{"get pods --root R", 0, []string{`(?m)^default +demo +main +example\.com/foo +dev-\d,dev-\d +Healthy,Healthy +-$`}},
		{"get devices --root R", 0, []string{`(?m)^example\.com/foo +dev-\d +true +- +default/demo$`}},
		{"admit --root R -f examples/pod-too-many.yaml", 1, []string{
			`pod default/too-many rejected by the kubelet: UnexpectedAdmissionError: Allocate failed due to requested number of devices unavailable for example\.com/foo\. Requested: 9, Available: 6, which is unexpected`}},
		{"delete pod demo --root R", 0, []string{`pod "demo" deleted`}},
	}
	if len(commands) != len(want) {
		t.Fatalf("banner commands %q, want %d", commands, len(want))
	}
	for i, w := range want {
		printed := strings.Fields(commands[i])
		if printed[0] != bin || strings.Join(printed[1:], " ") != strings.ReplaceAll(w.args, "R", root) {
			t.Fatalf("banner command %d %q, want %s %s", i, commands[i], bin, w.args)
		}
		cmd := exec.CommandContext(ctx, printed[0], printed[1:]...)
		cmd.Dir = up.Dir
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != w.code {
			t.Errorf("%s: exit code %d, want %d\n%s", commands[i], code, w.code, out)
		}
		for _, re := range w.out {
			if !regexp.MustCompile(re).Match(out) {
				t.Errorf("%s: output does not match %s:\n%s", commands[i], re, out)
			}
		}
	}

	if err := up.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Read the output to its end (the process closing it), then reap it.
	var rest []string
	for done := false; !done; {
		select {
		case l, ok := <-lines:
			if !ok {
				done = true
				break
			}
			banner = append(banner, l)
			rest = append(rest, l)
		case <-time.After(time.Minute):
			t.Fatal("dpkit up did not exit within a minute of SIGTERM")
		}
	}
	if err := up.Wait(); err != nil {
		t.Errorf("dpkit up exited with %v after SIGTERM, want 0", err)
	}
	if !slices.Contains(rest, "stopped") {
		t.Errorf("output after SIGTERM %q does not say stopped", rest)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("dpkit up logged errors:\n%s", logs.String())
	}
	var socks []string
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 {
			socks = append(socks, p)
		}
		return nil
	})
	if len(socks) != 0 {
		t.Errorf("sockets left after SIGTERM: %v", socks)
	}
}
