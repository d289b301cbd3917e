package devfs

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/fsnotify/fsnotify"
)

// Watcher calls Rescan when something may have changed below a dev root:
// once at the start, after fsnotify events in the watched directories, and
// every Interval. Directories that do not exist yet (a /dev/dri created
// when a driver loads) are watched as soon as they appear; events on the
// parent of a missing directory trigger rescans meanwhile. sysfs and procfs
// do not support inotify, so the interval is what finds changes there.
type Watcher struct {
	// Dirs are local directories to watch (not recursive).
	Dirs []string
	// Interval between rescans; 0 disables the periodic rescan.
	Interval time.Duration
	// Rescan is called from Run's goroutine, never concurrently.
	Rescan func()
	// Logger receives the watcher's logs; nil discards them.
	Logger *slog.Logger
}

// Run watches until ctx is done and returns ctx's error. It falls back to
// the periodic rescan alone when inotify is unavailable.
func (w *Watcher) Run(ctx context.Context) error {
	log := w.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("Cannot watch device directories; relying on the periodic rescan", "err", err)
	} else {
		defer func() { _ = fw.Close() }()
		events, errs = fw.Events, fw.Errors
	}
	watched := make(map[string]bool)
	addWatches := func() {
		if fw == nil {
			return
		}
		current := make(map[string]bool)
		for _, p := range fw.WatchList() {
			current[p] = true
		}
		for _, d := range w.Dirs {
			target := d
			if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
				// Watch the nearest existing ancestor so that the
				// directory's creation is noticed.
				target = nearestDir(d)
			}
			if target == "" || current[target] {
				continue
			}
			if err := fw.Add(target); err != nil {
				if !watched[target] {
					log.Debug("Cannot watch directory", "dir", target, "err", err)
				}
				continue
			}
			current[target] = true
			watched[target] = true
		}
	}
	addWatches()
	w.Rescan()

	var tick <-chan time.Time
	if w.Interval > 0 {
		t := time.NewTicker(w.Interval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			log.Debug("Device directory changed", "path", ev.Name, "op", ev.Op.String())
			drain(events)
		case err, ok := <-errs:
			if !ok {
				errs = nil
				continue
			}
			log.Warn("Device directory watch failed; rescanning", "err", err)
		}
		addWatches()
		w.Rescan()
	}
}

// drain takes queued events so that a burst (udev creating a node, then
// its symlinks, then changing its mode) costs one rescan.
func drain(events <-chan fsnotify.Event) {
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		default:
			return
		}
	}
}

func nearestDir(p string) string {
	for {
		parent := parentDir(p)
		if parent == p {
			return ""
		}
		p = parent
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			return p
		}
	}
}

func parentDir(p string) string {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return p
}
