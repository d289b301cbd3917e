package imagespec_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/imagespec"
	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/internal/repopath"
	"github.com/dpkit/dpkit/internal/version"
)

// stage is what a Dockerfile stage sets, as Docker records it in the image
// config.
type stage struct {
	user       string
	ports      map[string]struct{}
	entrypoint []string
	cmd        []string
	labels     map[string]string
	copies     map[string]string // path in the image -> build stage path
}

// binary is how one binary of the images is built: its package and tags.
type binary struct{ pkg, tags string }

func readRepo(t *testing.T, rel string) string {
	t.Helper()
	p := repopath.Find(rel)
	if !filepath.IsAbs(p) {
		t.Fatalf("%s not found above the working directory", rel)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// instructions returns the Dockerfile's instructions, continuation lines
// joined and comments dropped.
func instructions(dockerfile string) [][2]string {
	var out [][2]string
	var cur strings.Builder
	for _, line := range strings.Split(dockerfile, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		cont := strings.HasSuffix(trimmed, "\\")
		cur.WriteString(strings.TrimSuffix(trimmed, "\\"))
		cur.WriteString(" ")
		if cont {
			continue
		}
		word, rest, _ := strings.Cut(strings.TrimSpace(cur.String()), " ")
		out = append(out, [2]string{strings.ToUpper(word), strings.TrimSpace(rest)})
		cur.Reset()
	}
	return out
}

var (
	labelKV = regexp.MustCompile(`([a-z.]+)="([^"]*)"`)
	// ${VERSION:-default}: what the label holds when no --build-arg is
	// given.
	defaultArg = regexp.MustCompile(`\$\{VERSION:-([^}]*)\}`)
	goBuild    = regexp.MustCompile(`go build .*-o (\S+) (\./cmd/\S+)`)
	goTags     = regexp.MustCompile(`-tags "([^"]*)"`)
)

// parseDockerfile returns the final stages by name and how the build
// stage builds each of its outputs.
func parseDockerfile(t *testing.T, dockerfile string) (map[string]*stage, map[string]binary) {
	t.Helper()
	stages, builds := map[string]*stage{}, map[string]binary{}
	var cur *stage
	for _, in := range instructions(dockerfile) {
		word, arg := in[0], in[1]
		if word == "FROM" {
			f := strings.Fields(arg)
			cur = &stage{ports: map[string]struct{}{}, labels: map[string]string{}, copies: map[string]string{}}
			stages[f[len(f)-1]] = cur
			continue
		}
		if cur == nil {
			continue
		}
		switch word {
		case "RUN":
			for _, part := range strings.Split(arg, "&&") {
				if m := goBuild.FindStringSubmatch(part); m != nil {
					b := binary{pkg: m[2]}
					if tags := goTags.FindStringSubmatch(part); tags != nil {
						b.tags = tags[1]
					}
					builds[m[1]] = b
				}
			}
		case "COPY":
			f := strings.Fields(arg)
			if len(f) == 3 && f[0] == "--from=build" {
				cur.copies[f[2]] = f[1]
			}
		case "USER":
			cur.user = arg
		case "EXPOSE":
			for _, p := range strings.Fields(arg) {
				if !strings.Contains(p, "/") {
					p += "/tcp" // Docker's default protocol
				}
				cur.ports[p] = struct{}{}
			}
		case "ENTRYPOINT", "CMD":
			var words []string
			if err := json.Unmarshal([]byte(arg), &words); err != nil {
				t.Fatalf("Dockerfile: %s %s: want the exec (JSON) form: %v", word, arg, err)
			}
			if word == "CMD" {
				cur.cmd = words
			} else {
				cur.entrypoint = words
			}
		case "LABEL":
			for _, m := range labelKV.FindAllStringSubmatch(arg, -1) {
				cur.labels[m[1]] = defaultArg.ReplaceAllString(m[2], "$1")
			}
		}
	}
	return stages, builds
}

// imagesBuilds returns how hack/images.sh builds the binary each -image
// packs.
func imagesBuilds(t *testing.T, script string) map[string]binary {
	t.Helper()
	built := map[string]binary{}
	for _, m := range regexp.MustCompile(`(?m)^build (?:-tags "([^"]*)" )?-o "([^"]+)" (\./cmd/\S+)$`).FindAllStringSubmatch(script, -1) {
		built[m[2]] = binary{pkg: m[3], tags: m[1]}
	}
	out := map[string]binary{}
	for _, m := range regexp.MustCompile(`(?m)^image -image (\w+) -binary "([^"]+)"`).FindAllStringSubmatch(script, -1) {
		b, ok := built[m[2]]
		if !ok {
			t.Fatalf("hack/images.sh: -image %s packs %s, which no build line builds", m[1], m[2])
		}
		out[m[1]] = b
	}
	return out
}

// TestDockerfileMatches holds the Dockerfile (for users with Docker) and
// the images make images writes without Docker (imagespec) to the same
// binary, path, entrypoint, command, user, ports and labels. No Docker is
// needed: it reads the Dockerfile. (The distroless base brings what
// imagespec writes itself: PATH, the passwd and group entries, /tmp.)
func TestDockerfileMatches(t *testing.T) {
	t.Parallel()
	stages, dockerBuilds := parseDockerfile(t, readRepo(t, "Dockerfile"))
	makeBuilds := imagesBuilds(t, readRepo(t, "hack/images.sh"))
	for _, tc := range []struct {
		stage, image string
		spec         func(imagespec.Input) ociimage.Image
	}{
		{"plugin", "plugin", imagespec.Plugin},
		{"dpkit", "full", imagespec.Full},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			t.Parallel()
			st, ok := stages[tc.stage]
			if !ok {
				t.Fatalf("the Dockerfile has no stage %q (stages: %v)", tc.stage, keys(stages))
			}
			img := tc.spec(imagespec.Input{Binary: "bin", Name: "x/y:z", Version: version.Version})
			want := img.Config
			if want.ExposedPorts == nil {
				want.ExposedPorts = map[string]struct{}{}
			}
			for _, c := range []struct {
				what      string
				got, want any
			}{
				{"USER", st.user, want.User},
				{"EXPOSE", st.ports, want.ExposedPorts},
				{"ENTRYPOINT", st.entrypoint, want.Entrypoint},
				{"CMD", st.cmd, want.Cmd},
				{"LABEL (VERSION unset)", st.labels, want.Labels},
			} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("Dockerfile stage %s: %s = %v; imagespec's %s image has %v", tc.stage, c.what, c.got, tc.image, c.want)
				}
			}
			if len(st.copies) != 1 || st.copies[imagespec.BinaryPath] == "" {
				t.Fatalf("Dockerfile stage %s copies %v from the build stage, want one binary at %s", tc.stage, st.copies, imagespec.BinaryPath)
			}
			if !slices.ContainsFunc(img.Files, func(f ociimage.File) bool { return f.Path == imagespec.BinaryPath && f.Source == "bin" }) {
				t.Errorf("imagespec's %s image does not put the binary at %s", tc.image, imagespec.BinaryPath)
			}
			docker, ok := dockerBuilds[st.copies[imagespec.BinaryPath]]
			if !ok {
				t.Fatalf("the Dockerfile's build stage does not build %s (it builds %v)", st.copies[imagespec.BinaryPath], dockerBuilds)
			}
			if mk := makeBuilds[tc.image]; mk != docker {
				t.Errorf("the %s image's binary: the Dockerfile builds %s with tags %q, hack/images.sh builds %s with tags %q",
					tc.image, docker.pkg, docker.tags, mk.pkg, mk.tags)
			}
		})
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
