package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMakeImagesReproducible runs `make images` twice, into two bin
// directories: the binaries are built twice and packed twice, and the
// archives are the same bytes, so the images have the same digests.
func TestMakeImagesReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("runs make images twice (builds dpkit and dpkit-cluster for linux); skipped under -short")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make images needs make: %v (apt-get install make)", err)
	}
	// Its own budget, not testContext's: a cold `make images` builds
	// dpkit and dpkit-cluster from scratch, which takes minutes on a slow
	// machine.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	build := func(bin string) (printed string, archives map[string][]byte) {
		t.Helper()
		cmd := exec.CommandContext(ctx, "make", "images", "BIN="+bin)
		cmd.Dir = filepath.Join("..", "..")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("make images BIN=%s: %v\n%s%s", bin, err, stdout.String(), stderr.String())
		}
		archives = map[string][]byte{}
		for _, name := range []string{"dpkit-plugin.tar", "dpkit.tar"} {
			b, err := os.ReadFile(filepath.Join(bin, "images", name))
			if err != nil {
				t.Fatal(err)
			}
			archives[name] = b
		}
		// hack/image prints "ARCHIVE  NAME  DIGEST" for each image.
		var lines []string
		for _, line := range strings.Split(stdout.String(), "\n") {
			if strings.HasPrefix(line, bin+"/images/") {
				lines = append(lines, strings.TrimPrefix(line, bin))
			}
		}
		if len(lines) != 2 {
			t.Fatalf("make images printed %d image lines, want 2:\n%s", len(lines), stdout.String())
		}
		return strings.Join(lines, "\n"), archives
	}
	first, a := build(t.TempDir())
	second, b := build(t.TempDir())
	t.Logf("make images:\n%s", first)
	if first != second {
		t.Errorf("make images twice printed different digests:\n%s\nthen\n%s", first, second)
	}
	for name := range a {
		if !bytes.Equal(a[name], b[name]) {
			t.Errorf("%s differs between two runs of make images", name)
		}
	}
}
