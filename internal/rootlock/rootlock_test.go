package rootlock

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/testdir"
)

func TestAcquire(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "root")
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	first, err := acquire(root, Holder{PID: 4242, Command: "dpkit up --root " + root, Started: started})
	if err != nil {
		t.Fatal(err)
	}
	if first.Path() != filepath.Join(root, FileName) {
		t.Errorf("Path() = %s", first.Path())
	}

	// A second lock on the same root, even in this process (flock locks
	// belong to open files), is refused and names the first.
	_, err = Acquire(root)
	var held *HeldError
	if !errors.As(err, &held) || held.Holder == nil || held.Holder.PID != 4242 {
		t.Fatalf("second Acquire = %v, want a HeldError naming pid 4242", err)
	}
	for _, want := range []string{"root " + root + " is in use by pid 4242 (dpkit up --root " + root + ", started ", "choose another --root"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	// Released, the root can be taken again, and the file says by whom.
	if err := first.Release(); err != nil {
		t.Fatal(err)
	}
	if err := first.Release(); err != nil {
		t.Errorf("second Release: %v", err)
	}
	second, err := Acquire(root)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	defer func() { _ = second.Release() }()
	if h := read(second.Path()); h == nil || h.PID != os.Getpid() || h.Command != strings.Join(os.Args, " ") || h.Started.IsZero() {
		t.Errorf("lock file records %+v, want this process", h)
	}
}

// TestAcquireLiveSocket checks a root whose kubelet.sock answers: another
// kubelet when no dpkit process holds the lock (and the root is left
// without a lock file), the holder when one does.
func TestAcquireLiveSocket(t *testing.T) {
	t.Parallel()
	root := testdir.Short(t, "rl")
	sock := filepath.Join(root, "device-plugins", "kubelet.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		t.Fatal(err)
	}

	// A stale socket (nothing listens) does not stop anyone.
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	lk, err := Acquire(root)
	if err != nil {
		t.Fatalf("Acquire with a stale socket: %v", err)
	}
	_ = lk.Release()
	if err := os.Remove(filepath.Join(root, FileName)); err != nil {
		t.Fatal(err)
	}

	// A live one without a lock is another kubelet.
	_ = os.Remove(sock)
	l, err = net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	_, err = Acquire(root)
	var foreign *ForeignError
	if !errors.As(err, &foreign) || !strings.Contains(err.Error(), "another kubelet (not dpkit) serves "+sock) {
		t.Fatalf("Acquire with a live socket = %v, want another kubelet serving %s", err, sock)
	}
	if _, err := os.Stat(filepath.Join(root, FileName)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a lock file was left in another kubelet's root: %v", err)
	}

	// A live one with a dpkit holder names the holder.
	holder, err := acquireAnyway(t, root)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Release() }()
	_, err = Acquire(root)
	var held *HeldError
	if !errors.As(err, &held) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("Acquire with a live socket and a holder = %v, want a HeldError naming pid %d", err, os.Getpid())
	}
}

// acquireAnyway takes the lock the way Acquire does once it found no
// live socket, as a dpkit process does before it serves kubelet.sock.
func acquireAnyway(t *testing.T, root string) (*Lock, error) {
	t.Helper()
	sock := filepath.Join(root, "device-plugins", "kubelet.sock")
	moved := sock + ".away"
	if err := os.Rename(sock, moved); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := os.Rename(moved, sock); err != nil {
			t.Fatal(err)
		}
	}()
	return Acquire(root)
}

func TestAcquireErrors(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(filepath.Join(file, "root")); err == nil || !strings.Contains(err.Error(), "locking root "+filepath.Join(file, "root")) {
		t.Errorf("Acquire below a file = %v, want an error naming the root", err)
	}
}

// TestHeldErrorUnreadable checks the message when the holder's record
// cannot be read.
func TestHeldErrorUnreadable(t *testing.T) {
	t.Parallel()
	err := &HeldError{Root: "/r"}
	if want := "root /r is in use by another dpkit process; stop that process, or choose another --root"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}

// TestAcquireRefusesPlantedRoot: a lock file planted as a symbolic link is
// refused and its target left as it was; a root or lock file another user
// owns, or that group or others may write, is refused with the fix.
func TestAcquireRefusesPlantedRoot(t *testing.T) {
	t.Parallel()
	t.Run("lock file is a link", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		victim := filepath.Join(dir, "bashrc")
		if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		root := filepath.Join(dir, "root")
		if err := os.Mkdir(root, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(victim, filepath.Join(root, FileName)); err != nil {
			t.Fatal(err)
		}
		_, err := Acquire(root)
		if err == nil || !strings.Contains(err.Error(), "is a symbolic link") {
			t.Errorf("Acquire with a planted link = %v, want refused naming the link", err)
		}
		if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
			t.Errorf("the link's target now holds %q", b)
		}
	})
	t.Run("root writable by others", func(t *testing.T) {
		t.Parallel()
		root := filepath.Join(t.TempDir(), "root")
		if err := os.Mkdir(root, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(root, 0o777); err != nil {
			t.Fatal(err)
		}
		_, err := Acquire(root)
		if err == nil || !strings.Contains(err.Error(), "chmod go-w "+root) {
			t.Errorf("Acquire of a world-writable root = %v, want refused with the chmod", err)
		}
	})
	t.Run("root of another user", func(t *testing.T) {
		t.Parallel()
		if os.Geteuid() != 0 {
			t.Skip("giving a directory to another user needs root")
		}
		// A root owned by root passes for anyone (as /var/lib does): give
		// it to nobody.
		root := filepath.Join(t.TempDir(), "root")
		if err := os.Mkdir(root, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(root, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		_, err := Acquire(root)
		if err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("Acquire of another user's root = %v, want refused naming its owner", err)
		}
	})
}
