package repopath_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dpkit/dpkit/internal/repopath"
)

func TestFind(t *testing.T) {
	got := repopath.Find("hack/test.sh")
	if !filepath.IsAbs(got) {
		t.Fatalf("Find(hack/test.sh) = %q, want an absolute path", got)
	}
	if _, err := os.Stat(got); err != nil {
		t.Fatal(err)
	}
	if got := repopath.Find("no/such/file"); got != "no/such/file" {
		t.Fatalf("Find of a missing file = %q, want it unchanged", got)
	}
}
