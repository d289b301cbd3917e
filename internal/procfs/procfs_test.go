package procfs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestStatOfSelf(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID() != os.Getppid() || st.PGRP() != syscall.Getpgrp() || st.StartTicks() == 0 || st.Exited() || st.Exiting() {
		t.Errorf("stat of self: ppid %d pgrp %d start %d state %c; want %d, %d, >0, running", st.PPID(), st.PGRP(), st.StartTicks(), st.State(), os.Getppid(), syscall.Getpgrp())
	}
	if !slices.Contains(PIDs(), os.Getpid()) {
		t.Error("PIDs does not list this process")
	}
	if _, err := ReadStat(-1); err == nil {
		t.Error("ReadStat(-1) succeeded")
	}
}

func TestMounts(t *testing.T) {
	ms, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(ms, func(m Mount) bool { return m.Point == "/" }) {
		t.Errorf("no mount at / in %v", ms)
	}
	if !slices.ContainsFunc(ms, func(m Mount) bool { return m.Point == "/proc" && m.FSType == "proc" }) {
		t.Errorf("no proc mount at /proc in %v", ms)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/plain`: "/plain", `/tab\011x\134`: "/tab\tx\\", `/short\04`: `/short\04`} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRemoveTree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a")
	if err := os.MkdirAll(filepath.Join(dir, "b", "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there: %v", dir, err)
	}
	if err := RemoveTree(dir); err != nil {
		t.Errorf("RemoveTree of a missing directory: %v", err)
	}
}
