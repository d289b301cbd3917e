package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/repopath"
)

const module = "github.com/dpkit/dpkit"

// imports returns every package of the module (by path relative to the
// module root) with the module packages its non-test files import,
// whatever their build tags.
func imports(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module (hack/tools, ...)
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, is := range f.Imports {
			p, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return err
			}
			if rest, ok := strings.CutPrefix(p, module+"/"); ok && !slices.Contains(out[pkg], rest) {
				out[pkg] = append(out[pkg], rest)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// verb reports whether pkg is a subcommand package: below internal/cli,
// not the shared machinery (internal/cli, internal/cli/output) and not
// internal/cli/app or below, which wire the verbs (dpkit's and
// dpkit-cluster's).
func verb(pkg string) bool {
	if !under(pkg, "internal/cli") || under(pkg, "internal/cli/app") {
		return false
	}
	switch pkg {
	case "internal/cli", "internal/cli/output":
		return false
	}
	return true
}

// rules are the import rules of docs/architecture.md: each returns why
// pkg may not import imp, or "" when it may.
var rules = []func(pkg, imp string) string{
	func(pkg, imp string) string {
		if verb(imp) && !under(pkg, "internal/cli/app") && !under(pkg, verb0(imp)) {
			return "only internal/cli/app (and internal/cli/app/cluster) imports a verb package; move what is shared out of the verb (kind's rule)"
		}
		return ""
	},
	func(pkg, imp string) string {
		if under(pkg, "pkg") && under(imp, "internal/cli") {
			return "pkg/ never imports the CLI"
		}
		return ""
	},
	func(pkg, imp string) string {
		if under(pkg, "pkg/discovery") && under(imp, "pkg/deviceplugin") {
			return "device discovery does not depend on the plugin SDK"
		}
		return ""
	},
	func(pkg, imp string) string {
		if under(pkg, "pkg/virtualnode/nodeapi") && under(imp, "internal") {
			return "the node API package stands alone, without internal packages"
		}
		return ""
	},
	func(pkg, imp string) string {
		if (under(pkg, "internal/emulator") || under(pkg, "pkg/virtualnode")) && (under(imp, "pkg/devicemanager") || under(imp, "pkg/dramanager")) {
			return "the emulated kubelet and the virtual node admit pods through pkg/devicehost (the container manager's face) and import neither manager"
		}
		return ""
	},
}

// verb0 returns the verb package that pkg, a verb or a package below
// one, belongs to: internal/cli/<verb>.
func verb0(pkg string) string {
	parts := strings.SplitN(pkg, "/", 4)
	return strings.Join(parts[:min(len(parts), 3)], "/")
}

func TestImportRules(t *testing.T) {
	t.Parallel()
	gomod := repopath.Find("go.mod")
	if !filepath.IsAbs(gomod) {
		t.Fatal("go.mod of the module not found above the working directory")
	}
	root := filepath.Dir(gomod)
	graph := imports(t, root)
	if len(graph["internal/cli/app"]) == 0 || len(graph["pkg/devicehost"]) == 0 {
		t.Fatalf("the import graph of %s looks empty: %v", root, graph)
	}
	for pkg, imps := range graph {
		for _, imp := range imps {
			for _, rule := range rules {
				if why := rule(pkg, imp); why != "" {
					t.Errorf("%s imports %s: %s", pkg, imp, why)
				}
			}
		}
	}
}

// TestRulesCatch checks that each rule fires on an import it forbids.
func TestRulesCatch(t *testing.T) {
	t.Parallel()
	for _, bad := range [][2]string{
		{"internal/cli/up", "internal/cli/kubelet"},
		{"internal/emulator", "internal/cli/get"},
		{"pkg/devicehost", "internal/cli"},
		{"pkg/discovery/devfs", "pkg/deviceplugin"},
		{"pkg/virtualnode/nodeapi", "internal/httpserve"},
		{"internal/emulator", "pkg/devicemanager"},
		{"internal/emulator", "pkg/dramanager"},
		{"pkg/virtualnode", "pkg/dramanager"},
		{"pkg/virtualnode/backend/sim", "pkg/devicemanager/checkpoint"},
	} {
		caught := false
		for _, rule := range rules {
			caught = caught || rule(bad[0], bad[1]) != ""
		}
		if !caught {
			t.Errorf("%s importing %s is not caught", bad[0], bad[1])
		}
	}
	for _, ok := range [][2]string{
		{"internal/cli/app", "internal/cli/up"},
		{"internal/cli/app/cluster", "internal/cli/node"},
		{"internal/cli/up", "internal/cli/output"},
		{"internal/cli/up", "internal/emulator"},
		{"internal/noderun", "internal/cli"},
		{"pkg/virtualnode", "pkg/devicehost"},
		{"pkg/devicehost", "pkg/dramanager"},
		{"internal/noderun", "pkg/devicemanager"},
	} {
		for _, rule := range rules {
			if why := rule(ok[0], ok[1]); why != "" {
				t.Errorf("%s importing %s is refused: %s", ok[0], ok[1], why)
			}
		}
	}
}

// heavy are the module prefixes the dpkit binary must not link: the
// Kubernetes client, the virtual-kubelet, the apiserver and the DRA helper
// libraries are what made a cold "go run ./cmd/dpkit up" take minutes
// (docs/performance.md). The commands that need them are in
// cmd/dpkit-cluster, which dpkit runs for them.
var heavy = []string{"k8s.io/client-go", "github.com/virtual-kubelet", "k8s.io/apiserver", "k8s.io/dynamic-resource-allocation"}

// deps returns the packages pkg links, as go list -deps prints them.
func deps(t *testing.T, root, pkg string, flags ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append(append([]string{"list", "-deps"}, flags...), pkg)...)
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	return strings.Fields(string(out))
}

// TestDpkitBinaryIsLean checks that cmd/dpkit, the README's first
// command, links none of the heavy libraries, and that cmd/dpkit-cluster
// still has the commands that need them.
func TestDpkitBinaryIsLean(t *testing.T) {
	t.Parallel()
	root := filepath.Dir(repopath.Find("go.mod"))
	linked := func(list []string, prefix string) []string {
		var out []string
		for _, p := range list {
			if p == prefix || strings.HasPrefix(p, prefix+"/") {
				out = append(out, p)
			}
		}
		return out
	}
	lean := deps(t, root, "./cmd/dpkit")
	for _, prefix := range heavy {
		if got := linked(lean, prefix); len(got) > 0 {
			t.Errorf("cmd/dpkit links %d packages of %s, e.g. %s: move the command that needs them to cmd/dpkit-cluster (internal/cli/app/cluster)",
				len(got), prefix, got[0])
		}
	}
	full := deps(t, root, "./cmd/dpkit-cluster")
	for _, want := range []string{module + "/internal/cli/node", module + "/internal/cli/advertise", "k8s.io/client-go/kubernetes", "github.com/virtual-kubelet/virtual-kubelet/node"} {
		if !slices.Contains(full, want) {
			t.Errorf("cmd/dpkit-cluster does not link %s", want)
		}
	}
	if len(full) <= len(lean) {
		t.Errorf("cmd/dpkit-cluster links %d packages, cmd/dpkit %d: the split looks wrong", len(full), len(lean))
	}
	t.Logf("cmd/dpkit links %d packages, cmd/dpkit-cluster %d", len(lean), len(full))

	// The plugin image's build ("plugin" and "version") links no
	// Kubernetes API types either: k8s.io/api/core/v1 alone made its
	// binary 5 MB larger and its RSS 2 MiB (docs/performance.md).
	plugin := deps(t, root, "./cmd/dpkit", "-tags", "dpkit_lean grpcnotrace")
	if got := linked(plugin, "k8s.io/api"); len(got) > 0 {
		t.Errorf("the lean build of cmd/dpkit (-tags dpkit_lean) links %s: keep API types out of what \"dpkit plugin\" imports (internal/cli, pkg/plugins, ...)", got)
	}
	// Nor apimachinery's quantities and validation helpers, which bring
	// klog and CBOR: 0.7 MB of binary for a syntax check
	// (plugins.ValidQuantity, validate/content do the same).
	for _, heavy := range []string{"k8s.io/klog", "k8s.io/apimachinery/pkg/api/resource", "github.com/fxamacker/cbor"} {
		if got := linked(plugin, heavy); len(got) > 0 {
			t.Errorf("the lean build of cmd/dpkit links %s: check syntax with plugins.ValidQuantity or k8s.io/apimachinery/pkg/api/validate/content instead", got)
		}
	}
}
