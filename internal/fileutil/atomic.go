// Package fileutil writes files the way every dpkit component that keeps
// state on disk must: atomically, never through a planted link, and
// leaving nothing behind when it fails.
package fileutil

import (
	"fmt"
	"os"
	"path/filepath"
)

// WriteAtomic replaces the file at path with data, readable as perm. The
// data goes to a new temporary file in the same directory, created
// exclusively under a random name (so a symlink planted at a predictable
// temporary path is never followed), is synced, and is renamed over path
// (which replaces a symlink at path rather than writing through it); then
// the directory is synced. On failure the temporary file is removed and
// path is left as it was.
func WriteAtomic(path string, data []byte, perm os.FileMode) error {
	return writeAtomic(path, data, perm, true)
}

// WriteCheckpoint is WriteAtomic as the kubelet writes its checkpoints
// (its file store): the new file is synced before it replaces path, but
// the directory is not synced after the rename. After a crash, path holds
// its old content or the new, each whole. It is for state rewritten on
// every change (a device or DRA checkpoint, written once per pod
// admitted), where the directory's sync would be a third of each write.
func WriteCheckpoint(path string, data []byte, perm os.FileMode) error {
	return writeAtomic(path, data, perm, false)
}

func writeAtomic(path string, data []byte, perm os.FileMode, syncDir bool) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	name := tmp.Name()
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(name)
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return err
	}
	if perm != 0o600 { // os.CreateTemp's mode
		if err = tmp.Chmod(perm); err != nil {
			return err
		}
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(name, path); err != nil {
		return err
	}
	if syncDir {
		syncDirectory(dir)
	}
	return nil
}

// syncDirectory syncs dir so that a rename in it survives a crash; a
// variable so that tests count the syncs.
var syncDirectory = func(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
