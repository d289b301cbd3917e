package testdir

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

func TestShort(t *testing.T) {
	var dir string
	t.Run("sub", func(t *testing.T) {
		dir = Short(t, "td")
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Fatalf("Short = %s: %v", dir, err)
		}
		if filepath.Dir(dir) != filepath.Clean(os.TempDir()) || !strings.HasPrefix(filepath.Base(dir), "td") {
			t.Errorf("Short = %s, want td* directly below %s", dir, os.TempDir())
		}
		if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s after the test: %v, want it removed", dir, err)
	}
}

// fatalTB records Fatalf and stops the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestShortFails(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing"))
	f := &fatalTB{TB: t}
	done := make(chan string, 1)
	go func() {
		defer close(done)
		done <- Short(f, "td")
	}()
	if dir, ok := <-done; ok {
		t.Errorf("Short = %s with TMPDIR missing, want the test failed", dir)
	}
	if !strings.Contains(f.msg, "making a short temporary directory") {
		t.Errorf("Fatalf(%q), want it to say what failed", f.msg)
	}
}
