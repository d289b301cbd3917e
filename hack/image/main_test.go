package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readTar returns every regular file and the mode of every entry of the
// archive in data.
func readTar(t *testing.T, data []byte) (files map[string][]byte, modes map[string]int64) {
	t.Helper()
	files, modes = map[string][]byte{}, map[string]int64{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, modes
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, dup := modes[h.Name]; dup {
			t.Errorf("entry %s twice", h.Name)
		}
		modes[h.Name] = h.Mode
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(epoch) {
			t.Errorf("%s: uid %d gid %d mtime %v, want root and the epoch", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		}
	}
}

// blob returns the blob d names and checks its digest and size.
func blob(t *testing.T, files map[string][]byte, d descriptor) []byte {
	t.Helper()
	b, ok := files[blobPath(d.Digest)]
	if !ok {
		t.Fatalf("no blob %s", d.Digest)
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest %s size %d, want size %d", d.Digest, got, len(b), d.Size)
	}
	return b
}

func unmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
}

func TestWrite(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "dpkit-plugin")
	if err := os.WriteFile(bin, []byte("\x7fELF not really"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := Spec{
		Tag:          "ghcr.io/dpkit/dpkit-plugin:v0.1.0",
		Files:        map[string]string{"/usr/bin/dpkit": bin},
		Entrypoint:   []string{"/usr/bin/dpkit"},
		Cmd:          []string{"plugin", "--config", "/etc/dpkit/config.yaml"},
		User:         "0:0",
		ExposedPorts: []string{"9400/tcp"},
		OS:           "linux",
		Arch:         "arm64",
		Labels:       map[string]string{"org.opencontainers.image.version": "v0.1.0"},
	}
	var a, b bytes.Buffer
	if err := Write(&a, spec); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, spec); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two archives of the same spec differ; builds are not reproducible")
	}
	files, _ := readTar(t, a.Bytes())

	// The OCI layout: oci-layout, index.json naming the image, its manifest.
	var layout struct{ ImageLayoutVersion string }
	unmarshal(t, files["oci-layout"], &layout)
	if layout.ImageLayoutVersion != "1.0.0" {
		t.Errorf("oci-layout version %q", layout.ImageLayoutVersion)
	}
	var idx index
	unmarshal(t, files["index.json"], &idx)
	if len(idx.Manifests) != 1 {
		t.Fatalf("index lists %d manifests, want 1", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	if md.Annotations["io.containerd.image.name"] != spec.Tag || md.Annotations["org.opencontainers.image.ref.name"] != "v0.1.0" {
		t.Errorf("index annotations %v: containerd would not name the image %s", md.Annotations, spec.Tag)
	}
	var man manifest
	unmarshal(t, blob(t, files, md), &man)
	if man.MediaType != mediaManifest || len(man.Layers) != 1 {
		t.Fatalf("manifest %+v", man)
	}
	var cfg imageConfig
	unmarshal(t, blob(t, files, man.Config), &cfg)
	layer := blob(t, files, man.Layers[0])
	if cfg.OS != "linux" || cfg.Architecture != "arm64" || cfg.Config.User != "0:0" ||
		strings.Join(cfg.Config.Entrypoint, " ") != "/usr/bin/dpkit" || strings.Join(cfg.Config.Cmd, " ") != "plugin --config /etc/dpkit/config.yaml" {
		t.Errorf("config %+v", cfg)
	}
	if _, ok := cfg.Config.ExposedPorts["9400/tcp"]; !ok || cfg.Config.Labels["org.opencontainers.image.version"] != "v0.1.0" {
		t.Errorf("config ports %v labels %v", cfg.Config.ExposedPorts, cfg.Config.Labels)
	}
	if len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != man.Layers[0].Digest {
		t.Errorf("diff_ids %v, want the uncompressed layer's digest %s", cfg.RootFS.DiffIDs, man.Layers[0].Digest)
	}

	// Docker's manifest.json points at the same blobs.
	var docker []dockerManifest
	unmarshal(t, files["manifest.json"], &docker)
	if len(docker) != 1 || strings.Join(docker[0].RepoTags, ",") != spec.Tag ||
		docker[0].Config != blobPath(man.Config.Digest) || strings.Join(docker[0].Layers, ",") != blobPath(man.Layers[0].Digest) {
		t.Errorf("manifest.json %+v", docker)
	}

	// The layer: the binary, /etc/passwd with nobody, a sticky /tmp.
	lfiles, lmodes := readTar(t, layer)
	if got := string(lfiles["usr/bin/dpkit"]); got != "\x7fELF not really" || lmodes["usr/bin/dpkit"] != 0o755 {
		t.Errorf("usr/bin/dpkit: %q mode %o", got, lmodes["usr/bin/dpkit"])
	}
	if !strings.Contains(string(lfiles["etc/passwd"]), "nobody:x:65534:") {
		t.Errorf("etc/passwd %q has no nobody", lfiles["etc/passwd"])
	}
	for dir, mode := range map[string]int64{"tmp/": 0o1777, "usr/": 0o755, "usr/bin/": 0o755, "etc/": 0o755} {
		if m, ok := lmodes[dir]; !ok || m != mode {
			t.Errorf("layer dir %s: present %t mode %o, want %o", dir, ok, m, mode)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "bin")
	if err := os.WriteFile(bin, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	good := func() Spec {
		return Spec{Tag: "ghcr.io/dpkit/dpkit:v0.1.0", Files: map[string]string{"/usr/bin/dpkit": bin}, OS: "linux", Arch: "amd64"}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	tests := []struct {
		name string
		edit func(*Spec)
		want []string
	}{
		{"no tag", func(s *Spec) { s.Tag = "ghcr.io/dpkit/dpkit" }, []string{"-tag", "with a tag"}},
		{"port for a tag", func(s *Spec) { s.Tag = "localhost:5000/dpkit" }, []string{"-tag"}},
		{"upper case", func(s *Spec) { s.Tag = "ghcr.io/DPKIT/dpkit:v1" }, []string{"lower case"}},
		{"no files", func(s *Spec) { s.Files = nil }, []string{"-file"}},
		{"relative path", func(s *Spec) { s.Files = map[string]string{"usr/bin/dpkit": bin} }, []string{"absolute"}},
		{"missing binary", func(s *Spec) { s.Files = map[string]string{"/usr/bin/dpkit": bin + ".gone"} }, []string{"no such file"}},
		{"bad port", func(s *Spec) { s.ExposedPorts = []string{"9400"} }, []string{"-expose", "PORT/tcp"}},
		{"everything at once", func(s *Spec) { s.Tag, s.Arch = "x", "" }, []string{"-tag", "-arch"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := good()
			tc.edit(&s)
			err := s.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if Write(io.Discard, s) == nil {
				t.Error("Write accepted a spec Validate refuses")
			}
		})
	}
}

func TestRun(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "dpkit")
	if err := os.WriteFile(bin, []byte("binary"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "img.tar")
	err := run([]string{"-tag", "ghcr.io/dpkit/dpkit:v0.1.0", "-file", bin + "=/usr/bin/dpkit", "-entrypoint", "/usr/bin/dpkit",
		"-cmd", "plugin", "-cmd", "--config=/etc/dpkit/config.yaml", "-label", "a=b", "-o", out}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	files, _ := readTar(t, data)
	if !strings.Contains(string(files["manifest.json"]), "ghcr.io/dpkit/dpkit:v0.1.0") {
		t.Errorf("manifest.json %s", files["manifest.json"])
	}
	for _, bad := range [][]string{
		{"-tag", "a/b:c", "-file", "no-equals-sign", "-o", out},
		{"-tag", "a/b:c", "-file", bin + "=/usr/bin/dpkit"},
		{"-tag", "a/b:c", "-file", bin + "=/usr/bin/dpkit", "-label", "novalue", "-o", out},
	} {
		if err := run(bad, io.Discard); err == nil {
			t.Errorf("run %v: no error", bad)
		}
	}
}
