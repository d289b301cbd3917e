package ociimage_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/ociimage"
)

func testImage(t *testing.T) ociimage.Image {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return ociimage.Image{
		Name: "example.test/tools/tool:v1", OS: "linux", Architecture: "amd64",
		Config: ociimage.Config{
			User: "65532:65532", Entrypoint: []string{"/usr/bin/tool"}, Cmd: []string{"serve"},
			ExposedPorts: map[string]struct{}{"9400/tcp": {}},
			Labels:       map[string]string{"org.opencontainers.image.source": "https://example.test"},
		},
		Files: []ociimage.File{
			{Path: "/usr/bin/tool", Mode: 0o755, Source: bin},
			{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0::/:/sbin/nologin\n")},
			{Path: "/bin/sh", Mode: fs.ModeSymlink | 0o777, Target: "/usr/bin/tool"},
			{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		},
	}
}

func write(t *testing.T, img ociimage.Image) ([]byte, ociimage.Result) {
	t.Helper()
	var buf bytes.Buffer
	res, err := ociimage.Write(&buf, img)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	return buf.Bytes(), res
}

// TestReproducible: the same input gives the same bytes, whatever the
// source file's own time and mode; a changed byte changes the digest.
func TestReproducible(t *testing.T) {
	t.Parallel()
	img := testImage(t)
	a, resA := write(t, img)
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(img.Files[0].Source, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(img.Files[0].Source, 0o700); err != nil {
		t.Fatal(err)
	}
	b, resB := write(t, img)
	if !bytes.Equal(a, b) || resA.Manifest.Digest != resB.Manifest.Digest {
		t.Fatalf("two writes of the same image differ: %s vs %s", resA.Manifest.Digest, resB.Manifest.Digest)
	}
	img.Files[1].Data = []byte("root:x:0:0::/:/bin/sh\n")
	_, resC := write(t, img)
	if resC.Manifest.Digest == resA.Manifest.Digest || resC.DiffID == resA.DiffID {
		t.Fatalf("changed content kept digest %s", resA.Manifest.Digest)
	}
}

// TestLayout reads the archive back the way an importer does: index ->
// manifest -> config and layer, each blob named by its digest, and checks
// the image's configuration and files.
func TestLayout(t *testing.T) {
	t.Parallel()
	img := testImage(t)
	archive, res := write(t, img)
	blobs := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) {
			t.Errorf("%s: time %v, want the epoch", h.Name, h.ModTime)
		}
		b, _ := io.ReadAll(tr)
		blobs[h.Name] = b
	}
	if string(blobs["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout = %q", blobs["oci-layout"])
	}
	blob := func(d ociimage.Descriptor) []byte {
		t.Helper()
		b, ok := blobs["blobs/sha256/"+strings.TrimPrefix(d.Digest, "sha256:")]
		if !ok {
			t.Fatalf("blob %s missing", d.Digest)
		}
		if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != d.Digest || int64(len(b)) != d.Size {
			t.Fatalf("blob %s does not match its descriptor", d.Digest)
		}
		return b
	}
	var idx struct{ Manifests []ociimage.Descriptor }
	if err := json.Unmarshal(blobs["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, blobs["index.json"])
	}
	m := idx.Manifests[0]
	if m.Digest != res.Manifest.Digest || m.Annotations[ociimage.AnnotationContainerName] != img.Name || m.Annotations[ociimage.AnnotationRefName] != "v1" {
		t.Errorf("index entry = %+v", m)
	}
	var man struct {
		Config ociimage.Descriptor
		Layers []ociimage.Descriptor
	}
	if err := json.Unmarshal(blob(m), &man); err != nil || len(man.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	// Docker's manifest.json (what docker load before Docker 25 reads)
	// names the image and points at the same blobs.
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(blobs["manifest.json"], &docker); err != nil {
		t.Fatalf("manifest.json: %v %s", err, blobs["manifest.json"])
	}
	blobName := func(d ociimage.Descriptor) string { return "blobs/sha256/" + strings.TrimPrefix(d.Digest, "sha256:") }
	if len(docker) != 1 || strings.Join(docker[0].RepoTags, ",") != img.Name || docker[0].Config != blobName(man.Config) ||
		strings.Join(docker[0].Layers, ",") != blobName(man.Layers[0]) {
		t.Errorf("manifest.json = %+v, want %s with config %s and layer %s", docker, img.Name, blobName(man.Config), blobName(man.Layers[0]))
	}
	var cfg struct {
		OS, Architecture string
		Config           ociimage.Config
		RootFS           struct {
			DiffIDs []string `json:"diff_ids"`
		}
	}
	if err := json.Unmarshal(blob(man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || cfg.Config.User != "65532:65532" ||
		strings.Join(cfg.Config.Entrypoint, " ") != "/usr/bin/tool" || len(cfg.Config.ExposedPorts) != 1 ||
		cfg.Config.Labels["org.opencontainers.image.source"] == "" {
		t.Errorf("config = %+v", cfg)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blob(man.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(raw); len(cfg.RootFS.DiffIDs) != 1 || cfg.RootFS.DiffIDs[0] != "sha256:"+hex.EncodeToString(sum[:]) {
		t.Errorf("diff_ids %v do not match the layer", cfg.RootFS.DiffIDs)
	}
	var got []string
	lr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := lr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, h.Name+" "+string(h.Typeflag)+" "+strings.TrimLeft(fs.FileMode(h.Mode).String(), "-")+" "+h.Linkname)
	}
	want := []string{
		"bin/ 5 rwxr-xr-x ", "bin/sh 2 rwxrwxrwx /usr/bin/tool", "etc/ 5 rwxr-xr-x ", "etc/passwd 0 rw-r--r-- ",
		"tmp/ 5 rwxrwxrwx ", "usr/ 5 rwxr-xr-x ", "usr/bin/ 5 rwxr-xr-x ", "usr/bin/tool 0 rwxr-xr-x ",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("layer entries:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestValidate: every problem is reported at once, each naming its field.
func TestValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	img := ociimage.Image{
		Name:   "example.test/x",
		Config: ociimage.Config{ExposedPorts: map[string]struct{}{"9400": {}, "9401/sctp": {}}},
		Files: []ociimage.File{
			{Path: "/"}, {Path: "a", Mode: 0o644}, {Path: "/a", Mode: 0o644},
			{Path: "l", Mode: fs.ModeSymlink}, {Path: "d", Mode: fs.ModeDevice}, {Path: "b", Data: []byte{}, Source: "x"},
			{Path: "gone", Mode: 0o755, Source: filepath.Join(dir, "gone")}, {Path: "dir", Mode: 0o755, Source: dir},
		},
	}
	_, err := ociimage.Write(io.Discard, img)
	if err == nil {
		t.Fatal("Write accepted an invalid image")
	}
	for _, want := range []string{
		"has no tag", "OS is empty", "Architecture is empty", "Files[0].Path", "listed twice", "without a Target",
		"only regular files", "both Data and Source", `ExposedPorts "9400": want PORT/tcp`, `ExposedPorts "9401/sctp"`,
		"Files[6] (gone): Source", "no such file", "Files[7] (dir): Source " + dir + " is not a regular file",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}

// TestValidateName: an image name must be a full reference with a tag.
func TestValidateName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, want string }{
		{"", "Name is empty"},
		{"ghcr.io/dpkit/dpkit", "has no tag"},
		{"localhost:5000/dpkit", "has no tag"}, // a registry's port is not a tag
		{"ghcr.io/DPKIT/dpkit:v1", "lower case"},
		{"ghcr.io/dpkit/dpkit:v1 x", "tag one word"},
		{"ghcr.io/dpkit/dpkit:v0.1.0", ""},
		{"localhost:5000/dpkit:dev", ""},
	} {
		img := ociimage.Image{Name: tc.name, OS: "linux", Architecture: "amd64"}
		err := img.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Name %q: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Name %q: error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}

// TestWriteFile: the archive is written whole, and a refused image leaves
// the file that was there.
func TestWriteFile(t *testing.T) {
	t.Parallel()
	img := testImage(t)
	out := filepath.Join(t.TempDir(), "img.tar")
	want, res := write(t, img)
	if got, err := ociimage.WriteFile(out, img); err != nil || got.Manifest.Digest != res.Manifest.Digest {
		t.Fatalf("WriteFile: %v, digest %s, want %s", err, got.Manifest.Digest, res.Manifest.Digest)
	}
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("WriteFile wrote %d bytes (%v), want the %d Write gives", len(b), err, len(want))
	}
	bad := img
	bad.Name = "no-tag"
	if _, err := ociimage.WriteFile(out, bad); err == nil {
		t.Fatal("WriteFile accepted an image without a tag")
	}
	if b, _ := os.ReadFile(out); !bytes.Equal(b, want) {
		t.Error("a refused image changed the archive already there")
	}
}

// TestBlobs: Blobs gives the blobs Write packs, byte for byte, each under
// its digest, and the same Result.
func TestBlobs(t *testing.T) {
	t.Parallel()
	img := testImage(t)
	archive, want := write(t, img)
	res, blobs, err := ociimage.Blobs(img)
	if err != nil {
		t.Fatal(err)
	}
	if res.Manifest.Digest != want.Manifest.Digest || res.Config.Digest != want.Config.Digest || res.Layer.Digest != want.Layer.Digest {
		t.Errorf("Blobs result %+v, Write's %+v", res, want)
	}
	packed := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && d != "" {
			b, _ := io.ReadAll(tr)
			packed["sha256:"+d] = b
		}
	}
	if len(blobs) != len(packed) || len(blobs) != 3 {
		t.Fatalf("Blobs gave %d blobs, the archive has %d, want 3", len(blobs), len(packed))
	}
	for d, b := range blobs {
		sum := sha256.Sum256(b)
		if "sha256:"+hex.EncodeToString(sum[:]) != d {
			t.Errorf("blob under %s has digest sha256:%x", d, sum)
		}
		if !bytes.Equal(b, packed[d]) {
			t.Errorf("blob %s differs from the archive's", d)
		}
	}
}
