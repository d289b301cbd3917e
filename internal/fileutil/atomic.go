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
func WriteAtomic(path string, data []byte, perm os.FileMode) (err error) {
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
	if err = tmp.Chmod(perm); err != nil {
		return err
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
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
