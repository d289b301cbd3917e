package pluginwatcher

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"

	"github.com/dpkit/dpkit/internal/fswatch"
)

// startFS creates the directory, starts watching it and every
// subdirectory, and records the sockets already there.
func (w *Watcher) startFS() (*fswatch.Watch, error) {
	if err := os.MkdirAll(w.dir, 0o750); err != nil {
		return nil, fmt.Errorf("pluginwatcher: creating plugin directory %s: %w", w.dir, err)
	}
	fsw, err := fswatch.New()
	if err != nil {
		return nil, fmt.Errorf("pluginwatcher: starting file system watcher: %w", err)
	}
	if err := w.traverse(fsw, w.dir); err != nil {
		_ = fsw.Close()
		return nil, err
	}
	w.log.Info("Watching plugin directory", "dir", w.dir)
	return fsw, nil
}

// traverse watches dir and its subdirectories and adds the sockets found
// in them to the desired state. The watch is added before the walk so
// that no socket created meanwhile is missed. Only an error on dir itself
// is returned; errors below it are logged.
func (w *Watcher) traverse(fsw *fswatch.Watch, dir string) error {
	if err := fsw.Add(dir); err != nil {
		return fmt.Errorf("pluginwatcher: watching %s: %w", dir, err)
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return fmt.Errorf("pluginwatcher: reading %s: %w", path, err)
			}
			w.log.Warn("Cannot read path in plugin directory", "path", path, "err", err)
			return nil
		}
		if path == dir {
			return nil
		}
		if ignoredName(path) {
			w.log.Debug("Ignoring file starting with '.'", "path", path)
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			if err := fsw.Add(path); err != nil {
				w.log.Warn("Cannot watch subdirectory", "path", path, "err", err)
			}
			return nil
		}
		if d.Type()&fs.ModeSocket == 0 {
			w.log.Debug("Ignoring non-socket file", "path", path, "mode", d.Type().String())
			return nil
		}
		info, err := d.Info()
		if err != nil {
			w.log.Debug("Socket vanished while scanning", "path", path, "err", err)
			return nil
		}
		w.addDesired(path, info)
		return nil
	})
}

// ignoredName reports whether path's base name starts with a dot.
func ignoredName(path string) bool {
	return strings.HasPrefix(filepath.Base(path), ".")
}

func (w *Watcher) handleEvent(fsw *fswatch.Watch, ev fsnotify.Event) {
	switch {
	case ev.Has(fsnotify.Create):
		if ignoredName(ev.Name) {
			w.log.Debug("Ignoring file starting with '.'", "path", ev.Name)
			return
		}
		info, err := os.Lstat(ev.Name)
		if err != nil {
			w.log.Debug("Created file vanished", "path", ev.Name, "err", err)
			return
		}
		switch {
		case info.IsDir():
			if err := w.traverse(fsw, ev.Name); err != nil {
				w.log.Warn("Cannot watch new subdirectory", "path", ev.Name, "err", err)
			}
		case info.Mode()&fs.ModeSocket != 0:
			w.addDesired(ev.Name, info)
		default:
			w.log.Debug("Ignoring non-socket file", "path", ev.Name, "mode", info.Mode().String())
		}
	case ev.Has(fsnotify.Remove), ev.Has(fsnotify.Rename):
		w.removeDesired(ev.Name)
	}
}

// resync rescans the whole directory after the kernel dropped events:
// sockets found are added, sockets gone are removed.
func (w *Watcher) resync(fsw *fswatch.Watch) {
	if err := w.traverse(fsw, w.dir); err != nil {
		w.log.Error("Rescanning plugin directory", "err", err)
		return
	}
	w.mu.Lock()
	var gone []string
	for path := range w.desired {
		if info, err := os.Lstat(path); err != nil || info.Mode()&fs.ModeSocket == 0 {
			gone = append(gone, path)
		}
	}
	w.mu.Unlock()
	for _, path := range gone {
		w.removeDesired(path)
	}
}

// addDesired records that a socket exists at path. A socket that is
// already recorded as the same file keeps its generation; a new file at a
// known path (the socket was re-created) gets a new one, which makes the
// reconciler deregister the old plugin and register the new.
func (w *Watcher) addDesired(path string, info os.FileInfo) {
	w.mu.Lock()
	delete(w.dead, path)
	if d, ok := w.desired[path]; ok && d.info != nil && os.SameFile(d.info, info) {
		w.mu.Unlock()
		return
	}
	w.nextGen++
	w.desired[path] = desired{seen: w.clock.Now(), gen: w.nextGen, info: info}
	w.mu.Unlock()
	w.log.Debug("Plugin socket found", "path", path)
	w.kick()
}

// removeDesired forgets the socket at path and, if path was a directory,
// every socket below it.
func (w *Watcher) removeDesired(path string) {
	prefix := path + string(filepath.Separator)
	w.mu.Lock()
	n := 0
	for p := range w.desired {
		if p == path || strings.HasPrefix(p, prefix) {
			delete(w.desired, p)
			n++
		}
	}
	for p := range w.dead {
		if p == path || strings.HasPrefix(p, prefix) {
			delete(w.dead, p)
		}
	}
	w.mu.Unlock()
	if n > 0 {
		w.log.Debug("Plugin socket removed", "path", path, "sockets", n)
		w.kick()
	}
}
