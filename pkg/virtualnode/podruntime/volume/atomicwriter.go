package volume

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// file is one file of a volume's payload.
type file struct {
	data []byte
	mode fs.FileMode
}

const (
	dataDirName    = "..data"
	newDataDirName = "..data_tmp"
)

// writeAtomic makes dir show payload (relative path -> file) the way the
// kubelet's AtomicWriter does (pkg/volume/util/atomic_writer.go), so that
// a container sees a ConfigMap's update all at once: the files are
// written into a new hidden directory ..<timestamp>, the symlink ..data
// is switched to it with one rename, and each top-level name of the
// payload is a symlink through ..data. Names that left the payload are
// removed, then the previous directory. Nothing is written when the
// payload did not change.
func writeAtomic(dir string, payload map[string]file) error {
	for p := range payload {
		if err := validatePath(p); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dataLink := filepath.Join(dir, dataDirName)
	oldTS, err := os.Readlink(dataLink)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var oldPaths map[string]bool
	if oldTS != "" {
		oldPaths = map[string]bool{}
		same, err := sameContent(filepath.Join(dir, oldTS), payload, oldPaths)
		if err != nil {
			return err
		}
		if same {
			return nil
		}
	}
	tsDir, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	tsName := filepath.Base(tsDir)
	if err := writePayload(tsDir, payload); err != nil {
		_ = os.RemoveAll(tsDir)
		return err
	}
	tmpLink := filepath.Join(dir, newDataDirName)
	_ = os.Remove(tmpLink)
	if err := os.Symlink(tsName, tmpLink); err != nil {
		_ = os.RemoveAll(tsDir)
		return err
	}
	if err := os.Rename(tmpLink, dataLink); err != nil {
		_ = os.Remove(tmpLink)
		_ = os.RemoveAll(tsDir)
		return err
	}
	top := map[string]bool{}
	for p := range payload {
		top[strings.SplitN(p, string(filepath.Separator), 2)[0]] = true
	}
	for name := range top {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join(dataDirName, name), link); err != nil {
			return err
		}
	}
	for p := range oldPaths {
		if name := strings.SplitN(p, string(filepath.Separator), 2)[0]; !top[name] {
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
				return err
			}
		}
	}
	if oldTS != "" {
		return os.RemoveAll(filepath.Join(dir, oldTS))
	}
	return nil
}

// validatePath refuses the paths the kubelet refuses: absolute ones,
// ones with a ".." element, and ones that begin with "..".
func validatePath(p string) error {
	switch {
	case p == "":
		return errors.New("invalid path: must not be empty")
	case filepath.IsAbs(p):
		return fmt.Errorf("invalid path %q: must be relative", p)
	case strings.HasPrefix(p, ".."):
		return fmt.Errorf("invalid path %q: must not start with '..'", p)
	case slices.Contains(strings.Split(p, string(filepath.Separator)), ".."):
		return fmt.Errorf("invalid path %q: must not contain '..'", p)
	}
	return nil
}

func writePayload(dir string, payload map[string]file) error {
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	for p, f := range payload {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(full, f.data, f.mode); err != nil {
			return err
		}
		// The umask must not narrow the volume's mode.
		if err := os.Chmod(full, f.mode); err != nil {
			return err
		}
	}
	return nil
}

// sameContent reports whether the directory holds exactly payload's
// paths and contents (modes are not compared, as the kubelet's
// shouldWritePayload: fsGroup ownership widens them after the write); it
// records the paths it holds in paths.
func sameContent(dir string, payload map[string]file, paths map[string]bool) (bool, error) {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		paths[rel] = true
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil || len(paths) != len(payload) {
		return false, err
	}
	for p, f := range payload {
		if !paths[p] {
			return false, nil
		}
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || !bytes.Equal(b, f.data) {
			return false, nil //nolint:nilerr // a missing or unreadable file is rewritten
		}
	}
	return true, nil
}
