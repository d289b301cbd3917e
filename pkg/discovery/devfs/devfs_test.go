package devfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

func TestGlob(t *testing.T) {
	t.Parallel()
	root := "../testdata/hosts/laptop/dev"
	tests := []struct {
		pattern string
		want    []string
		err     bool
	}{
		{"/dev/ttyUSB*", []string{"/dev/ttyUSB0", "/dev/ttyUSB1"}, false},
		{"/dev/tty*", []string{"/dev/ttyACM0", "/dev/ttyUSB0", "/dev/ttyUSB1"}, false},
		{"/dev/fuse", []string{"/dev/fuse"}, false},
		{"/dev/missing", []string{}, false},
		{"/dev/bus/usb/*/*", []string{"/dev/bus/usb/001/001", "/dev/bus/usb/001/004", "/dev/bus/usb/001/005", "/dev/bus/usb/003/001", "/dev/bus/usb/003/002"}, false},
		{"/etc/passwd", nil, true},
		{"/dev/../etc", nil, true},
		{"/dev/[", nil, true},
	}
	for _, tt := range tests {
		got, err := Glob(root, tt.pattern)
		if (err != nil) != tt.err || (!tt.err && !slices.Equal(got, tt.want)) {
			t.Errorf("Glob(%q) = %v, %v; want %v (error %v)", tt.pattern, got, err, tt.want, tt.err)
		}
	}
}

func TestStat(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "fuse"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "dri"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("nowhere", filepath.Join(root, "dangling")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path               string
		exists, accessible bool
	}{
		{"/dev/fuse", true, true},
		{"/dev/dri", true, false},
		{"/dev/dangling", false, false},
		{"/dev/none", false, false},
		{"/proc/1", false, false},
	}
	for _, tt := range tests {
		n := Stat(root, tt.path)
		if n.Exists != tt.exists || n.Accessible != tt.accessible || (n.Accessible == (n.Err != nil)) {
			t.Errorf("Stat(%s) = %+v", tt.path, n)
		}
	}
	// A real char device: /dev/null exists on every Linux host.
	if n := Stat("/dev", "/dev/null"); !n.Char || n.Major != 1 || n.Minor != 3 || !n.Accessible {
		t.Errorf("Stat(/dev/null) = %+v, want char 1:3", n)
	}
}

// TestStatDenied: a node this process may not read (the device cgroup of
// an unprivileged container answers EPERM, a file mode EACCES) is Denied,
// not missing: the device may be fine. Other errors are not.
func TestStatDenied(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "fuse"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	defer func(f func(string, uint32) error) { access = f }(access)
	for _, tt := range []struct {
		err    error
		denied bool
	}{{syscall.EPERM, true}, {syscall.EACCES, true}, {syscall.EIO, false}} {
		access = func(string, uint32) error { return tt.err }
		n := Stat(root, "/dev/fuse")
		if n.Accessible || n.Denied != tt.denied || !n.Exists || !errors.Is(n.Err, tt.err) {
			t.Errorf("access answering %v: %+v, want denied %v", tt.err, n, tt.denied)
		}
	}
}

func TestSortNatural(t *testing.T) {
	t.Parallel()
	s := []string{"ttyUSB10", "ttyUSB2", "renderD129", "renderD128", "a01", "a1", "a", "b"}
	SortNatural(s)
	want := []string{"a", "a1", "a01", "b", "renderD128", "renderD129", "ttyUSB2", "ttyUSB10"}
	if !slices.Equal(s, want) {
		t.Errorf("got %v, want %v", s, want)
	}
}

func TestRel(t *testing.T) {
	t.Parallel()
	if _, err := Rel("/dev"); !errors.Is(err, ErrNotBelowDev) {
		t.Errorf("Rel(/dev) err = %v", err)
	}
	if r, err := Rel("/dev/dri/../kfd"); err != nil || r != "kfd" {
		t.Errorf("Rel = %q, %v", r, err)
	}
}

// TestWatcher checks that creating a node in a watched directory and in a
// directory that did not exist when watching began both cause rescans.
func TestWatcher(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	rescans := make(chan struct{}, 100)
	w := &Watcher{
		Dirs:   []string{root, filepath.Join(root, "dri")},
		Rescan: func() { rescans <- struct{}{} },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v", err)
		}
	}()
	wait := func(what string) {
		t.Helper()
		select {
		case <-rescans:
		case <-time.After(5 * time.Second):
			t.Fatalf("no rescan after %s", what)
		}
	}
	drainAll := func() {
		for {
			select {
			case <-rescans:
			default:
				return
			}
		}
	}
	wait("start")
	if err := os.WriteFile(filepath.Join(root, "ttyUSB0"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	wait("creating ttyUSB0")
	if err := os.Mkdir(filepath.Join(root, "dri"), 0o755); err != nil {
		t.Fatal(err)
	}
	wait("creating dri")
	drainAll()
	// The watch on dri is added after the rescan that followed its
	// creation; a new node in it must be seen.
	deadline := time.After(5 * time.Second)
	for i := 0; ; i++ {
		if err := os.WriteFile(filepath.Join(root, "dri", "renderD"+string(rune('a'+i%26))), nil, 0o666); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rescans:
			return
		case <-deadline:
			t.Fatal("no rescan after creating a node in dri")
		}
	}
}

func TestWatcherInterval(t *testing.T) {
	t.Parallel()
	n := 0
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{Interval: time.Millisecond, Rescan: func() {
		n++
		if n == 3 {
			cancel()
		}
	}}
	if err := w.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v", err)
	}
	if n < 3 {
		t.Fatalf("%d rescans", n)
	}
}
