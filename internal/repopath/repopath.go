// Package repopath finds files of the dpkit source tree from wherever a test
// or command runs inside it.
package repopath

import (
	"os"
	"path/filepath"
)

// Find returns the absolute path of rel (e.g. "hack/build-upstream.sh") in
// the nearest directory at or above the working directory that holds it,
// or rel unchanged when none does.
func Find(rel string) string {
	wd, err := os.Getwd()
	if err != nil {
		return rel
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, rel)); err == nil {
			return filepath.Join(d, rel)
		}
		if filepath.Dir(d) == d {
			return rel
		}
	}
}
