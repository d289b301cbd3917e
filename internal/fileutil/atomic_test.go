package fileutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writers are the two ways to replace a file; both are atomic, never
// follow links and leave nothing behind.
var writers = []struct {
	name  string
	write func(string, []byte, os.FileMode) error
}{{"WriteAtomic", WriteAtomic}, {"WriteCheckpoint", WriteCheckpoint}}

func TestWriteAtomic(t *testing.T) {
	t.Parallel()
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			testWrite(t, w.write)
		})
	}
}

func testWrite(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := write(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := write(path, []byte("two"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("content %q, want two", b)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	if err := write(path, []byte("three"), 0o644); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v, want 0644", fi.Mode().Perm())
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left: %v", ents)
	}
}

// TestWriteAtomicDoesNotFollowLinks: a symlink planted at the path (or at
// the old predictable temporary path) is replaced, never written through.
func TestWriteAtomicDoesNotFollowLinks(t *testing.T) {
	t.Parallel()
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			testNoLinks(t, w.write)
		})
	}
}

func testNoLinks(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "pod.json")
	for _, link := range []string{path, path + ".tmp"} {
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
	}
	if err := write(path, []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the link target was written: %q", b)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink != 0 {
		t.Fatalf("%s is still a link (%v)", path, err)
	}
}

// TestWriteAtomicLeavesNothingOnFailure: when the rename fails (path is a
// directory), no temporary file is left.
func TestWriteAtomicLeavesNothingOnFailure(t *testing.T) {
	t.Parallel()
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) {
			t.Parallel()
			testNothingLeft(t, w.write)
		})
	}
}

func testNothingLeft(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	path := filepath.Join(dir, "busy")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := write(path, []byte("x"), 0o600)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("a write over a directory: %v, want an error naming it", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("files left: %v", ents)
	}
}

// TestDirectorySync: WriteAtomic syncs the directory after the rename;
// WriteCheckpoint, as the kubelet's checkpoints, does not. Not parallel:
// it replaces syncDirectory.
func TestDirectorySync(t *testing.T) {
	var synced []string
	orig := syncDirectory
	syncDirectory = func(dir string) { synced = append(synced, dir) }
	t.Cleanup(func() { syncDirectory = orig })
	dir := t.TempDir()
	if err := WriteCheckpoint(filepath.Join(dir, "checkpoint"), []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 0 {
		t.Fatalf("WriteCheckpoint synced %v, want no directory synced", synced)
	}
	if err := WriteAtomic(filepath.Join(dir, "state"), []byte("a"), 0o600); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 1 || synced[0] != dir {
		t.Fatalf("WriteAtomic synced %v, want [%s]", synced, dir)
	}
}
