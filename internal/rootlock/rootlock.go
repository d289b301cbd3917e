// Package rootlock makes one process the owner of a kubelet root
// directory. Two emulated kubelets (or virtual nodes) on one root would
// both serve device-plugins/kubelet.sock, each replacing the other's
// socket, and whichever stopped first would remove the sockets the other
// still serves. "dpkit kubelet", "dpkit up" and "dpkit node" take the lock
// before they serve anything.
//
// The lock is flock(2) on <root>/dpkit.lock, held for as long as the
// process keeps the Lock (the kernel drops it when the process ends, so a
// crash leaves nothing stale). The file records the holder's PID, command
// line and start time, for the error a second process gets. The lock file
// is never removed: removing it would let two processes hold locks on two
// different files of the same name.
//
// A kubelet that is not dpkit takes no such lock; Acquire also refuses a
// root whose device-plugins/kubelet.sock answers a connection.
package rootlock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FileName is the lock file's name below the root.
const FileName = "dpkit.lock"

// dialTimeout bounds the check that kubelet.sock answers. A listening
// unix socket accepts at once; this only guards against a full backlog.
const dialTimeout = 2 * time.Second

// Holder is the process that holds a root, as the lock file records it.
type Holder struct {
	PID     int       `json:"pid"`
	Command string    `json:"command"`
	Started time.Time `json:"started"`
}

func (h *Holder) String() string {
	return fmt.Sprintf("pid %d (%s, started %s)", h.PID, h.Command, h.Started.Local().Format(time.DateTime))
}

// HeldError says that another dpkit process holds the root.
type HeldError struct {
	Root string
	// Holder is nil when the lock file could not be read (its holder was
	// still writing it).
	Holder *Holder
}

func (e *HeldError) Error() string {
	who := "another dpkit process"
	if e.Holder != nil {
		who = e.Holder.String()
	}
	return fmt.Sprintf("root %s is in use by %s; stop that process, or choose another --root", e.Root, who)
}

// ForeignError says that a kubelet that is not dpkit (it holds no lock)
// serves the root's registration socket.
type ForeignError struct {
	Root   string
	Socket string
}

func (e *ForeignError) Error() string {
	return fmt.Sprintf("another kubelet (not dpkit) serves %s; stop it, or choose another --root", e.Socket)
}

// Lock is a held root lock. Release it when the process stops serving the
// root.
type Lock struct {
	mu   sync.Mutex
	f    *os.File
	path string
}

// Path returns the lock file's path.
func (l *Lock) Path() string { return l.path }

// Release drops the lock. It may be called more than once.
func (l *Lock) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}

// Acquire locks root for this process, recording its PID, command line
// and the current time. It creates root if needed. It returns a
// *HeldError when another dpkit process holds root, and a *ForeignError
// when root's device-plugins/kubelet.sock answers while no dpkit process
// holds it (a real kubelet; the lock file is not created then).
func Acquire(root string) (*Lock, error) {
	return acquire(root, Holder{PID: os.Getpid(), Command: strings.Join(os.Args, " "), Started: time.Now().UTC()})
}

func acquire(root string, me Holder) (*Lock, error) {
	if err := os.MkdirAll(root, 0o750); err != nil {
		return nil, fmt.Errorf("locking root %s: %w", root, err)
	}
	path := filepath.Join(root, FileName)
	sock := filepath.Join(root, "device-plugins", "kubelet.sock")
	if answers(sock) {
		if h, held := peek(path); held {
			return nil, &HeldError{Root: root, Holder: h}
		}
		return nil, &ForeignError{Root: root, Socket: sock}
	}
	if err := checkOwned(root, "root"); err != nil {
		return nil, err
	}
	// O_NOFOLLOW: a dpkit.lock planted as a symbolic link (to the user's
	// ~/.bashrc, say) would have the truncate and write below land there.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o644)
	if errors.Is(err, unix.ELOOP) {
		return nil, fmt.Errorf("locking root %s: %s is a symbolic link, which dpkit never makes: remove it, or choose another --root", root, path)
	}
	if err != nil {
		return nil, fmt.Errorf("locking root %s: %w", root, err)
	}
	if err := checkOwned(path, "lock file"); err != nil {
		_ = f.Close()
		return nil, err
	}
	if err := flock(f, unix.LOCK_EX); err != nil {
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Root: root, Holder: read(path)}
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	data, _ := json.Marshal(me)
	err = f.Truncate(0)
	if err == nil {
		_, err = f.WriteAt(append(data, '\n'), 0)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("writing %s: %w", path, err)
	}
	return &Lock{f: f, path: path}, nil
}

// flock takes how (LOCK_EX or LOCK_SH) on f without waiting, retrying
// when a signal interrupts the call.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// checkOwned refuses a root, or its lock file, that another user owns or
// that group or others may write: whoever can write it can replace the
// sockets and state files the node serves from it (a root prepared by
// another user under a shared directory such as /tmp). The superuser's
// files pass for any user, as /var/lib does.
func checkOwned(path, what string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("locking root: %w", err)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	me := os.Geteuid()
	if int(sys.Uid) != me && sys.Uid != 0 {
		return fmt.Errorf("locking root: the %s %s belongs to uid %d, not to this user (uid %d): choose a --root of your own", what, path, sys.Uid, me)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("locking root: the %s %s may be written by group or others (mode %#o): run chmod go-w %s, or choose another --root", what, path, st.Mode().Perm(), path)
	}
	return nil
}

// peek reports whether a process holds the lock at path, and who when the
// file says.
func peek(path string) (*Holder, bool) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false
	}
	defer func() { _ = f.Close() }()
	if err := flock(f, unix.LOCK_SH); err != nil {
		return read(path), errors.Is(err, unix.EWOULDBLOCK)
	}
	return nil, false
}

// read returns the holder the lock file at path records, nil when it
// cannot be read.
func read(path string) *Holder {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var h Holder
	if json.Unmarshal(data, &h) != nil || h.PID == 0 {
		return nil
	}
	return &h
}

// answers reports whether something accepts connections on the unix
// socket at path.
func answers(path string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
