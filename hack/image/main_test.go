package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/imagespec"
	"github.com/dpkit/dpkit/internal/ociimage"
)

// TestRun: the command writes what imagespec and ociimage give for the
// image it names, and prints its digest.
func TestRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "dpkit")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o600); err != nil {
		t.Fatal(err)
	}
	for kind, image := range images {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			out := filepath.Join(dir, kind+".tar")
			in := imagespec.Input{Binary: bin, Name: "ghcr.io/dpkit/x:v0.1.0", Version: "v0.1.0", Arch: "arm64"}
			var stdout bytes.Buffer
			err := run([]string{"-image", kind, "-binary", bin, "-tag", in.Name, "-version", in.Version, "-arch", in.Arch, "-o", out}, &stdout, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			res, err := ociimage.Write(&want, image(in))
			if err != nil {
				t.Fatal(err)
			}
			if got, err := os.ReadFile(out); err != nil || !bytes.Equal(got, want.Bytes()) {
				t.Errorf("%s: the archive is not imagespec's image written by ociimage (%v)", out, err)
			}
			if line := out + "  " + in.Name + "  " + res.Manifest.Digest + "\n"; stdout.String() != line {
				t.Errorf("printed %q, want %q", stdout.String(), line)
			}
		})
	}
}

// TestRunRefuses: bad flags are reported together, each naming its flag,
// and nothing is written.
func TestRunRefuses(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out := filepath.Join(dir, "img.tar")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"nothing", nil, []string{`-image ""`, "-binary", "-tag", "-version", "-o"}},
		{"unknown image", []string{"-image", "lean", "-binary", "b", "-version", "v1", "-o", out}, []string{`-image "lean": want plugin or full`}},
		{"stray argument", []string{"-image", "full", "-binary", "b", "-version", "v1", "-o", out, "extra"}, []string{`unexpected arguments ["extra"]`}},
		{"no tag", []string{"-image", "full", "-binary", filepath.Join(dir, "gone"), "-tag", "ghcr.io/dpkit/dpkit", "-version", "v1", "-o", out}, []string{"-tag ghcr.io/dpkit/dpkit", "has no tag", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := run(tc.args, io.Discard, io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("a refused command left %s (%v)", out, err)
	}
}
