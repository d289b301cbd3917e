package fswatch

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
)

// The tests share the process's watcher, as the nodes do; none runs in
// parallel, so each can see the shared watcher stop with its last Watch.

func open(t *testing.T) *Watch {
	t.Helper()
	w, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func add(t *testing.T, w *Watch, dir string) {
	t.Helper()
	if err := w.Add(dir); err != nil {
		t.Fatal(err)
	}
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// next is w's next event with name, skipping others (a create is followed
// by its write).
func next(t *testing.T, w *Watch, name string) fsnotify.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-w.Events:
			if !ok {
				t.Fatalf("events closed while waiting for %s", name)
			}
			if ev.Name == name {
				return ev
			}
		case err := <-w.Errors:
			t.Fatalf("waiting for %s: %v", name, err)
		case <-deadline:
			t.Fatalf("no event for %s", name)
		}
	}
}

// none checks that w has no event waiting, once a later event of sentinel
// (which the same shared reader delivered after) has come.
func none(t *testing.T, w *Watch, sentinel *Watch, sentinelFile string) {
	t.Helper()
	touch(t, sentinelFile)
	next(t, sentinel, sentinelFile)
	select {
	case ev := <-w.Events:
		t.Fatalf("event for another watch's directory: %v", ev)
	default:
	}
}

// TestWatchesSeeOnlyTheirDirectories: two watches on one shared watcher
// are each told of their own directory only, and one process holds one
// inotify instance for both.
func TestWatchesSeeOnlyTheirDirectories(t *testing.T) {
	a, b := open(t), open(t)
	if a.h != b.h {
		t.Fatal("two watches of one process do not share the watcher")
	}
	da, db := t.TempDir(), t.TempDir()
	add(t, a, da)
	add(t, b, db)
	touch(t, filepath.Join(da, "x.sock"))
	if ev := next(t, a, filepath.Join(da, "x.sock")); !ev.Has(fsnotify.Create) {
		t.Fatalf("first event %v, want a create", ev)
	}
	none(t, b, a, filepath.Join(da, "y"))
	if err := os.Remove(filepath.Join(da, "x.sock")); err != nil {
		t.Fatal(err)
	}
	for ev := next(t, a, filepath.Join(da, "x.sock")); !ev.Has(fsnotify.Remove); ev = next(t, a, filepath.Join(da, "x.sock")) {
	}
}

// TestSharedDirectoryOutlivesOneWatch: two watches of one directory are
// both told; when one closes, the other still is (the kernel's watch goes
// with the last).
func TestSharedDirectoryOutlivesOneWatch(t *testing.T) {
	a, b := open(t), open(t)
	dir := t.TempDir()
	add(t, a, dir)
	add(t, b, dir)
	touch(t, filepath.Join(dir, "one"))
	next(t, a, filepath.Join(dir, "one"))
	next(t, b, filepath.Join(dir, "one"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for range a.Events { // what came before the close, then closed
	}
	touch(t, filepath.Join(dir, "two"))
	next(t, b, filepath.Join(dir, "two"))
	if err := b.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(dir); !errors.Is(err, fsnotify.ErrNonExistentWatch) {
		t.Fatalf("removing an unwatched path: %v, want ErrNonExistentWatch", err)
	}
}

// TestFullWatchDoesNotStallOthers: a watch that does not read loses its
// events past EventBuffer and is told of the overflow, while another
// watch of the process is told of its own at once.
func TestFullWatchDoesNotStallOthers(t *testing.T) {
	slow, fast := open(t), open(t)
	ds, df := t.TempDir(), t.TempDir()
	add(t, slow, ds)
	add(t, fast, df)
	for i := range EventBuffer + 10 {
		touch(t, filepath.Join(ds, fmt.Sprint(i)))
	}
	touch(t, filepath.Join(df, "after"))
	next(t, fast, filepath.Join(df, "after"))
	select {
	case err := <-slow.Errors:
		if !errors.Is(err, fsnotify.ErrEventOverflow) {
			t.Fatalf("error %v, want ErrEventOverflow", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a full watch was not told of its overflow")
	}
	if n := len(slow.Events); n != EventBuffer {
		t.Fatalf("%d events held, want %d", n, EventBuffer)
	}
}

// TestDirectoryMadeAgain: a directory deleted and created again is
// watched again when added again, though another watch still counts it.
func TestDirectoryMadeAgain(t *testing.T) {
	a, b := open(t), open(t)
	dir := filepath.Join(t.TempDir(), "plugins")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	add(t, a, dir)
	add(t, b, dir)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	for ev := next(t, a, dir); !ev.Has(fsnotify.Remove); ev = next(t, a, dir) {
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	add(t, a, dir)
	touch(t, filepath.Join(dir, "new"))
	next(t, a, filepath.Join(dir, "new"))
}

// TestLastCloseStopsTheWatcher: the shared watcher stops with its last
// Watch, and a later New starts another.
func TestLastCloseStopsTheWatcher(t *testing.T) {
	a, err := New()
	if err != nil {
		t.Fatal(err)
	}
	h := a.h
	if err := a.Add(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.done:
	default:
		t.Fatal("the shared watcher still runs after its last watch closed")
	}
	if err := a.Add(t.TempDir()); !errors.Is(err, fsnotify.ErrClosed) {
		t.Fatalf("Add after Close: %v, want ErrClosed", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	b := open(t)
	if b.h == h {
		t.Fatal("a new watch joined a stopped watcher")
	}
	dir := t.TempDir()
	add(t, b, dir)
	touch(t, filepath.Join(dir, "f"))
	next(t, b, filepath.Join(dir, "f"))
}
