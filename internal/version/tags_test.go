package version

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/repopath"
)

// imageRef matches a reference to one of dpkit's images, with its tag.
var imageRef = regexp.MustCompile("ghcr\\.io/dpkit/(dpkit-plugin|dpkit)(:[^\\s\"'`)\\],]*)?")

// versionLine is how the Makefile and hack/images.sh read Version.
var versionLine = regexp.MustCompile(`(?m)^var Version = "(.*)"$`)

// tagOK reports whether tag (after the colon) is the tree's version or a
// variable that the Makefile, the Dockerfile or a script fills with it.
func tagOK(tag string) bool {
	switch tag {
	case Version, "$(VERSION)", "${VERSION}", "$VERSION":
		return true
	}
	return false
}

func repoRoot(t *testing.T) string {
	t.Helper()
	gomod := repopath.Find("go.mod")
	if !filepath.IsAbs(gomod) {
		t.Fatal("go.mod of the module not found above the working directory")
	}
	return filepath.Dir(gomod)
}

func read(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestImageTagsAgree keeps one image tag: the images that make images and
// the Dockerfile build, the manifests under deploy/, the Helm chart and
// every doc name ghcr.io/dpkit/dpkit and dpkit-plugin with Version, never
// :latest or :dev.
func TestImageTagsAgree(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)

	if m := versionLine.FindStringSubmatch(read(t, root, "internal/version/version.go")); m == nil || m[1] != Version {
		t.Fatalf("internal/version/version.go has no line `var Version = %q`, which the Makefile and hack/images.sh read", Version)
	}
	for _, f := range []string{"Makefile", "hack/images.sh"} {
		if !strings.Contains(read(t, root, f), `s/^var Version = "\(.*\)"$`) {
			t.Errorf("%s does not read VERSION from internal/version/version.go", f)
		}
	}

	// Every mention of an image, with a tag, has the version's.
	files := []string{"Makefile", "Dockerfile", "README.md", "hack/images.sh"}
	for _, dir := range []string{"deploy", "docs"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, err := filepath.Rel(root, p)
			files = append(files, rel)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	refs := 0
	for _, f := range files {
		for i, line := range strings.Split(read(t, root, f), "\n") {
			for _, m := range imageRef.FindAllStringSubmatch(line, -1) {
				refs++
				if tag := strings.TrimPrefix(m[2], ":"); m[2] != "" && !tagOK(tag) {
					t.Errorf("%s:%d: %s: tag the image %s (internal/version), e.g. %s:%s", f, i+1, m[0], Version, strings.TrimSuffix(m[0], m[2]), Version)
				}
			}
		}
	}
	if refs < 5 {
		t.Fatalf("found %d image references in %v; the pattern looks broken", refs, files)
	}

	// kustomize pins the tag with its images transformer.
	for _, k := range []string{"deploy/base/kustomization.yaml", "deploy/advertise/kustomization.yaml"} {
		var kust struct {
			Images []struct{ Name, NewName, NewTag string } `json:"images"`
		}
		if err := yaml.Unmarshal([]byte(read(t, root, k)), &kust); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		if len(kust.Images) == 0 {
			t.Errorf("%s sets no image", k)
		}
		for _, img := range kust.Images {
			if !imageRef.MatchString(img.NewName) || img.NewTag != Version {
				t.Errorf("%s: image %s -> %s:%s, want ghcr.io/dpkit/...:%s", k, img.Name, img.NewName, img.NewTag, Version)
			}
		}
	}

	// Helm: the tag defaults to appVersion.
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(read(t, root, "deploy/helm/dpkit/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != Version {
		t.Errorf("deploy/helm/dpkit/Chart.yaml: appVersion %q, want %q", chart.AppVersion, Version)
	}
	var values struct {
		Image struct{ Repository, Tag string } `json:"image"`
	}
	if err := yaml.Unmarshal([]byte(read(t, root, "deploy/helm/dpkit/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	if values.Image.Repository != "ghcr.io/dpkit/dpkit-plugin" || (values.Image.Tag != "" && values.Image.Tag != Version) {
		t.Errorf("deploy/helm/dpkit/values.yaml: image %s:%s, want ghcr.io/dpkit/dpkit-plugin with tag \"\" (appVersion) or %s",
			values.Image.Repository, values.Image.Tag, Version)
	}

	// The archives the docs load are the ones make images writes.
	images := read(t, root, "hack/images.sh")
	archive := regexp.MustCompile(`bin/images/([a-z-]+)\.tar`)
	for _, f := range files {
		for _, m := range archive.FindAllStringSubmatch(read(t, root, f), -1) {
			if !strings.Contains(images, "$BIN/images/"+m[1]+".tar") {
				t.Errorf("%s names %s, which hack/images.sh does not write", f, m[0])
			}
		}
	}
}
