// Package testdir gives tests short temporary directories.
package testdir

import (
	"os"
	"testing"
)

// Short returns a new directory below the system's temporary directory,
// named prefix followed by random digits, and removes it with everything
// below it when the test (or benchmark) and its subtests end. It fails the
// test if the directory cannot be made.
//
// Use it instead of t.TempDir for a directory that unix sockets go below
// (a kubelet root, a plugin directory): a socket's path is limited to 108
// bytes, and t.TempDir's holds the test's name, so a long test name or
// subtest name pushes the sockets past the limit. Keep prefix short.
func Short(t testing.TB, prefix string) string {
	t.Helper()
	return In(t, "", prefix)
}

// In is Short below parent ("" is the system's temporary directory).
func In(t testing.TB, parent, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, prefix)
	if err != nil {
		t.Fatalf("making a short temporary directory: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
