//go:build linux

package verify_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/dpkit/dpkit/internal/cli"
	verifycmd "github.com/dpkit/dpkit/internal/cli/verify"
	"github.com/dpkit/dpkit/pkg/verify"
)

// openPTY opens a pseudo-terminal of cols columns and returns its
// terminal side and what was written to it, complete once the returned
// function is called (after the writer is done); the terminal's "\r\n"
// become "\n".
func openPTY(t *testing.T, cols uint16) (*os.File, func() string) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal to test terminal output with: %v", err)
	}
	n, err := unix.IoctlGetUint32(int(master.Fd()), unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0)
	}
	if err != nil {
		_ = master.Close()
		t.Fatal(err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		_ = master.Close()
		t.Fatal(err)
	}
	if err := unix.IoctlSetWinsize(int(tty.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 50, Col: cols}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(&out, master) // ends with EIO once the terminal side is closed
	}()
	t.Cleanup(func() { _ = master.Close() })
	return tty, func() string {
		_ = tty.Close()
		<-done
		return strings.ReplaceAll(out.String(), "\r\n", "\n")
	}
}

func runOnTerminal(t *testing.T, args ...string) (string, error) {
	t.Helper()
	tty, output := openPTY(t, 100)
	env := &cli.Env{Out: tty, Err: io.Discard, Logger: slog.New(slog.DiscardHandler)}
	cmd := verifycmd.NewCommand(env)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	return output(), err
}

// On a terminal each check is printed as it is decided, with a coloured
// verdict; a failure gets its fix and link; details of other checks are
// cut to the terminal's width. Not parallel: it sets NO_COLOR.
func TestTerminalOutput(t *testing.T) {
	serving := verify.Checks()[0]
	t.Run("colour", func(t *testing.T) {
		t.Setenv("NO_COLOR", "") // restored when the test ends
		if err := os.Unsetenv("NO_COLOR"); err != nil {
			t.Fatal(err)
		}
		out, err := runOnTerminal(t, "--", "sh", "-c", "exit 3")
		if code := cli.ExitCode(err); code != 1 {
			t.Fatalf("exit code %d (%v), want 1", code, err)
		}
		for _, want := range []string{
			"Verifying sh -c exit 3 against an emulated kubelet\n",
			"\x1b[1;31mFAIL\x1b[0m  " + serving.ID + " ",
			" no Register call arrived: the plugin exited with status 3 before registering\n",
			"      " + serving.Description + "\n",
			"      fix: " + serving.Fix + "\n",
			"      see: " + serving.DocsURL() + "\n",
			"\x1b[2mSKIP\x1b[0m  " + verify.CheckVersion + " ",
			fmt.Sprintf("\n0 passed, 1 failed, %d skipped", len(verify.Checks())-1),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("terminal output lacks %q:\n%s", want, out)
			}
		}
		if strings.Contains(out, "CHECK") {
			t.Errorf("terminal output repeats the results as a table:\n%s", out)
		}
		cut := 0
		for _, line := range strings.Split(out, "\n") {
			if !strings.Contains(line, "SKIP") {
				continue
			}
			visible := len([]rune(strings.ReplaceAll(strings.ReplaceAll(line, "\x1b[2m", ""), "\x1b[0m", "")))
			switch {
			case visible > 100:
				t.Errorf("line of %d columns on a 100-column terminal: %q", visible, line)
			case visible == 100 && strings.HasSuffix(line, "..."):
				cut++
			}
		}
		if cut == 0 {
			t.Errorf("no skip detail was cut to the terminal's width:\n%s", out)
		}
	})
	t.Run("NO_COLOR", func(t *testing.T) {
		t.Setenv("NO_COLOR", "1")
		out, err := runOnTerminal(t, "--", "sh", "-c", "exit 3")
		if code := cli.ExitCode(err); code != 1 {
			t.Fatalf("exit code %d (%v), want 1", code, err)
		}
		if !strings.Contains(out, "FAIL  "+serving.ID) || strings.Contains(out, "\x1b[") {
			t.Errorf("with NO_COLOR set, want the verdicts without colour:\n%s", out)
		}
	})
}
