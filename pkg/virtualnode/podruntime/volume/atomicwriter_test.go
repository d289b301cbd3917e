package volume

import (
	"os"
	"path/filepath"
	"testing"
)

// TestWriteAtomicUnchanged: a payload the directory already shows is not
// written again, even when ownership changes widened the files' modes
// (as the kubelet's shouldWritePayload compares contents); a changed one
// switches ..data to a new directory. Paths the kubelet refuses fail.
func TestWriteAtomicUnchanged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	payload := map[string]file{"a": {data: []byte("1"), mode: 0o600}, "d/b": {data: []byte("2"), mode: 0o600}}
	if err := writeAtomic(dir, payload); err != nil {
		t.Fatal(err)
	}
	first, err := os.Readlink(filepath.Join(dir, dataDirName))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "a"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := writeAtomic(dir, payload); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Readlink(filepath.Join(dir, dataDirName)); again != first {
		t.Errorf("the same payload was written again: ..data %s, then %s", first, again)
	}
	payload["a"] = file{data: []byte("changed"), mode: 0o600}
	if err := writeAtomic(dir, payload); err != nil {
		t.Fatal(err)
	}
	if changed, _ := os.Readlink(filepath.Join(dir, dataDirName)); changed == first {
		t.Errorf("a changed payload was not written: ..data still %s", first)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a")); err != nil || string(b) != "changed" {
		t.Errorf("a: %q %v, want changed", b, err)
	}
	for _, bad := range []string{"/abs", "../up", "..hidden", "x/../../y"} {
		if err := writeAtomic(dir, map[string]file{bad: {data: nil, mode: 0o644}}); err == nil {
			t.Errorf("path %q accepted", bad)
		}
	}
}
