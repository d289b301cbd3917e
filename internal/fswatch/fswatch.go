// Package fswatch shares one inotify instance among a process's file
// watchers. Each virtual node of dpkit node --count N watches its plugin
// directory, its in-process plugin watches its socket, and a DRA front its
// checkpoint; with an fsnotify.Watcher each, 1 000 nodes held 2 000 to
// 3 000 inotify instances and one reading goroutine each, past Linux's
// default of 128 instances per user. Here they hold one instance and one
// goroutine per process, and a watch per directory.
//
// A Watch is used as an fsnotify.Watcher is: Add directories, read Events
// and Errors until Close. It is told of what happens in the directories
// it added (and to them), not of other watches' directories. Delivery
// never blocks the process's other watches: when a Watch's Events are
// full, its new events are dropped and it is told with
// fsnotify.ErrEventOverflow on Errors, as the kernel tells of its own
// queue overflowing; the owner rescans, as it would then.
package fswatch

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// EventBuffer is how many events a Watch holds unread before it is told
// of an overflow. Its owners read at once, see a few events a minute and
// look again at the directory on an overflow; under 0.5 KiB a Watch
// (a process of a thousand nodes has two thousand), where fsnotify's
// reader was a 128 KiB stack.
const EventBuffer = 16

// Watch is one owner's view of the process's shared watcher.
type Watch struct {
	// Events are the changes in the added directories and to them.
	Events <-chan fsnotify.Event
	// Errors are the shared watcher's errors, and
	// fsnotify.ErrEventOverflow when events were dropped.
	Errors <-chan error

	events chan fsnotify.Event
	errs   chan error
	h      *hub
	paths  map[string]bool // guarded by h.mu
	closed bool            // guarded by h.mu
}

// hub is the process's one fsnotify.Watcher and who watches what.
type hub struct {
	mu      sync.Mutex
	fsw     *fsnotify.Watcher
	subs    map[string]map[*Watch]bool // directory -> its watches
	watches int                        // open Watches
	done    chan struct{}              // closed when dispatch returns
}

var (
	sharedMu sync.Mutex
	shared   *hub
)

// New opens a Watch on the process's shared watcher, starting it if no
// other Watch is open.
func New() (*Watch, error) {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		fsw, err := fsnotify.NewWatcher()
		if err != nil {
			return nil, err
		}
		shared = &hub{fsw: fsw, subs: make(map[string]map[*Watch]bool), done: make(chan struct{})}
		go shared.dispatch()
	}
	h := shared
	h.mu.Lock()
	h.watches++
	h.mu.Unlock()
	w := &Watch{events: make(chan fsnotify.Event, EventBuffer), errs: make(chan error, 1), h: h, paths: make(map[string]bool)}
	w.Events, w.Errors = w.events, w.errs
	return w, nil
}

// Add watches path, a directory (or a file), for w. Adding a path again,
// after it was removed from the disk and made anew, watches the new one.
func (w *Watch) Add(path string) error {
	return w.open(path, func(h *hub, path string) error {
		// Always asked of the kernel: a directory deleted and created
		// again lost its watch with the old inode, whoever else still
		// counts it.
		if err := h.fsw.Add(path); err != nil {
			return err
		}
		w.paths[path] = true
		if h.subs[path] == nil {
			h.subs[path] = make(map[*Watch]bool)
		}
		h.subs[path][w] = true
		return nil
	})
}

// Remove stops watching path for w. The kernel's watch goes with the last
// Watch that added it.
func (w *Watch) Remove(path string) error {
	return w.open(path, func(h *hub, path string) error {
		if !w.paths[path] {
			return fmt.Errorf("%w: %s", fsnotify.ErrNonExistentWatch, path)
		}
		return h.removeLocked(w, path)
	})
}

// open runs f with the hub locked and path cleaned, unless w is closed.
func (w *Watch) open(path string, f func(h *hub, path string) error) error {
	h := w.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.closed {
		return fsnotify.ErrClosed
	}
	return f(h, filepath.Clean(path))
}

// removeLocked forgets w's watch of path, and the kernel's with the last.
func (h *hub) removeLocked(w *Watch, path string) error {
	delete(w.paths, path)
	delete(h.subs[path], w)
	if len(h.subs[path]) > 0 {
		return nil
	}
	delete(h.subs, path)
	// Gone already when the directory was deleted.
	if err := h.fsw.Remove(path); err != nil && !errors.Is(err, fsnotify.ErrNonExistentWatch) {
		return err
	}
	return nil
}

// Close stops w's watches and closes its channels. The shared watcher
// stops with the last open Watch.
func (w *Watch) Close() error {
	h := w.h
	h.mu.Lock()
	if w.closed {
		h.mu.Unlock()
		return nil
	}
	w.closed = true
	var errs []error
	for path := range w.paths {
		errs = append(errs, h.removeLocked(w, path))
	}
	// dispatch sends to w only under h.mu and never after this.
	close(w.events)
	close(w.errs)
	h.watches--
	last := h.watches == 0
	h.mu.Unlock()
	if last {
		sharedMu.Lock()
		// Another New may have opened a Watch on h meanwhile.
		h.mu.Lock()
		last = h.watches == 0
		h.mu.Unlock()
		if last {
			shared = nil
			errs = append(errs, h.fsw.Close())
		}
		sharedMu.Unlock()
		if last {
			<-h.done
		}
	}
	return errors.Join(errs...)
}

// dispatch hands each event to the watches of its directory and of the
// path itself, and each error to every watch, until the watcher closes.
func (h *hub) dispatch() {
	defer close(h.done)
	for {
		select {
		case ev, ok := <-h.fsw.Events:
			if !ok {
				return
			}
			h.mu.Lock()
			for w := range h.subs[filepath.Dir(ev.Name)] {
				w.send(ev)
			}
			for w := range h.subs[ev.Name] {
				if !h.subs[filepath.Dir(ev.Name)][w] {
					w.send(ev)
				}
			}
			h.mu.Unlock()
		case err, ok := <-h.fsw.Errors:
			if !ok {
				return
			}
			h.mu.Lock()
			for _, ws := range h.subs {
				for w := range ws {
					w.sendErr(err)
				}
			}
			h.mu.Unlock()
		}
	}
}

// send delivers ev without waiting; a full w is told of the overflow.
// Called with h.mu held.
func (w *Watch) send(ev fsnotify.Event) {
	select {
	case w.events <- ev:
	default:
		w.sendErr(fsnotify.ErrEventOverflow)
	}
}

// sendErr delivers err unless an error is already waiting to be read. An
// overflow takes the place of another error waiting: the rescan it asks
// for sees whatever that error was about. Called with h.mu held.
func (w *Watch) sendErr(err error) {
	select {
	case w.errs <- err:
		return
	default:
	}
	if !errors.Is(err, fsnotify.ErrEventOverflow) {
		return
	}
	select {
	case waiting := <-w.errs:
		if errors.Is(waiting, fsnotify.ErrEventOverflow) {
			err = waiting
		}
	default:
	}
	select {
	case w.errs <- err:
	default:
	}
}
