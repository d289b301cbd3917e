package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDecodePluginConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		yaml string
		want []string // substrings of the error; none means success
	}{
		{"example", mustRead(t, "../../examples/fake.yaml"), nil},
		{"generic example", mustRead(t, "../../examples/generic.yaml"), nil},
		{"amdgpu example", mustRead(t, "../../examples/amdgpu.yaml"), nil},
		{"nvidia example", mustRead(t, "../../examples/nvidia.yaml"), nil},
		{"nvidia DRA example", mustRead(t, "../../examples/nvidia-dra.yaml"), nil},
		{"json works too", `{"apiVersion":"dpkit.io/v1alpha1","kind":"PluginConfig","plugins":[{"fake":{"resources":[{"name":"example.com/foo"}]}}]}`, nil},
		// The wording every dpkit configuration file shares (pkg/configfile).
		{"wrong version and kind", "apiVersion: v1\nkind: Pod\n", []string{
			`apiVersion: Unsupported value: "v1": supported values: "dpkit.io/v1alpha1"`,
			`kind: Unsupported value: "Pod": supported values: "PluginConfig"`,
		}},
		{"another dpkit file", "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources: []\n", []string{
			"1 problem(s)", `kind: Unsupported value: "ExtendedResources": supported values: "PluginConfig"`,
		}},
		{"unknown field", "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: example.com/foo\n      cout: 3\n", []string{
			`plugins[0].fake.resources[0].cout: Not found: unknown field; did you mean "count"?`,
		}},
		{"every decode problem at once", `apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resourcename: example.com/foo
- nvidia:
    resourcename: example.com/gpu
    replicas: two
- fakee: {}
- generic:
    groups: {name: x}
`, []string{
			"5 problem(s)",
			`plugins[0].fake.resourcename: Not found: unknown field; did you mean "resources"?`,
			`plugins[1].nvidia.resourcename: Not found: unknown field; did you mean "resourceName"? (field names are case-sensitive)`,
			`plugins[1].nvidia.replicas: Invalid value: "two": must be a whole number, not a string`,
			`plugins[2].fakee: Not found: unknown field; did you mean "fake"?`,
			`plugins[3].generic.groups: Invalid value: must be a list, not a mapping`,
		}},
		{"explicit zeros", `apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resources:
    - name: example.com/foo
      count: 0
      idPattern: ""
- nvidia:
    replicas: 0
    rescanInterval: 0s
- generic:
    groups:
    - {name: serial, paths: [{path: /dev/ttyUSB*}], count: 0}
`, []string{
			"5 problem(s)",
			"plugins[0].fake.resources[0].count: Invalid value: 0: an explicit zero is not a setting here; leave the field out for the default, 8",
			`plugins[0].fake.resources[0].idPattern: Invalid value: "": an explicit zero is not a setting here; leave the field out for the default, "dev-{index}"`,
			"plugins[1].nvidia.replicas: Invalid value: 0: an explicit zero",
			`plugins[1].nvidia.rescanInterval: Invalid value: "0s": an explicit zero is not a setting here; leave the field out for the default, "10s"`,
			"plugins[2].generic.groups[0].count: Invalid value: 0: an explicit zero",
		}},
		{"relative directories", "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\npluginDir: dp\nregistryDir: ./reg\nplugins:\n- fake: {resources: [{name: example.com/foo}]}\n", []string{
			`pluginDir: Invalid value: "dp": must be an absolute path`, `registryDir: Invalid value: "./reg": must be an absolute path`,
		}},
		{"not yaml", "apiVersion: [\n", []string{"not valid YAML"}},
		{"no plugins", "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\n", []string{"plugins: Required value"}},
		{"empty entry", "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- {}\n", []string{"plugins[0]: Invalid value: \"0 kinds set\""}},
		{"every problem at once", `apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
registration: maybe
plugins:
- fake:
    resources:
    - name: kubernetes.io/foo
    - name: example.com/bar
      numaNodes: 9
- fake:
    resources:
    - name: example.com/bar
  nvidia: {}
`, []string{"4 problem(s)", "registration: Unsupported value", "plugins[0].fake.resources[0].name", "plugins[0].fake.resources[1].numaNodes", `plugins[1]: Invalid value: "2 kinds set"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, err := DecodePluginConfig([]byte(tc.yaml))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if f := cfg.Plugins[0].Fake; f != nil {
					if r := f.Resources[0]; r.Count != 8 || r.IDPattern != "dev-{index}" || cfg.Registration != "auto" {
						t.Errorf("defaults not applied: %+v %s", r, cfg.Registration)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestLoadPluginConfigMissingFile(t *testing.T) {
	t.Parallel()
	_, err := LoadPluginConfig(filepath.Join(t.TempDir(), "nope.yaml"), "--config")
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("err = %v", err)
	}
	_, err = LoadPluginConfig("", "--config")
	if err == nil || !strings.Contains(err.Error(), "--config is required") {
		t.Errorf("err = %v", err)
	}
}

func FuzzDecodePluginConfig(f *testing.F) {
	f.Add([]byte(mustRead(f, "../../examples/fake.yaml")))
	f.Add([]byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: example.com/x\n      count: 3\n      numaNodes: 2\n      healthChanges:\n      - {device: dev-1, after: 1s, health: Unhealthy}\n"))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := DecodePluginConfig(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		// A config that decodes must be usable.
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("accepted config fails validation: %v", errs)
		}
		for _, p := range cfg.Plugins {
			if p.Fake != nil {
				for _, r := range p.Fake.Resources {
					if r.Count > 1000 {
						return // building huge device sets is not the point here
					}
				}
			}
		}
		if _, err := cfg.Resources(cfg.HostOptions()); err != nil {
			t.Fatalf("accepted config cannot build its plugins: %v", err)
		}
	})
}

func mustRead(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPluginConfigCopies decodes every plugin config the project ships
// and checks that each copy Copies makes equals the decoded config and
// shares nothing with it or with another copy.
func TestPluginConfigCopies(t *testing.T) {
	t.Parallel()
	var files []string
	for _, pattern := range []string{
		"../../examples/*.yaml", "../../examples/profiles/*.yaml", "../../deploy/*/config.yaml",
		"../../deploy/overlays/*/config.yaml", "../../internal/cli/up/*.yaml", "../../pkg/verify/testdata/*.yaml",
	} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	decoded := 0
	for _, f := range files {
		data := []byte(mustRead(t, f))
		if !strings.Contains(string(data), "kind: PluginConfig") {
			continue
		}
		t.Run(filepath.Base(filepath.Dir(f))+"/"+filepath.Base(f), func(t *testing.T) {
			cfg, err := DecodePluginConfig(data)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			copies, err := cfg.Copies()
			if err != nil {
				t.Fatal(err)
			}
			a, err := copies()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(cfg, a); diff != "" {
				t.Fatalf("copy differs from the decoded config (-decoded +copy):\n%s", diff)
			}
			// Nothing shared: changing every plugin of one copy leaves
			// the config and the next copy as they were.
			for i := range a.Plugins {
				a.Plugins[i] = PluginSpec{Fronts: []string{"changed"}}
			}
			a.DRA.CDIDir = "/changed"
			b, err := copies()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(cfg, b); diff != "" {
				t.Fatalf("a copy changed by another (-decoded +copy):\n%s", diff)
			}
			if fresh, _ := DecodePluginConfig(data); !cmp.Equal(fresh, cfg) {
				t.Fatalf("the decoded config changed by a copy:\n%s", cmp.Diff(fresh, cfg))
			}
		})
		decoded++
	}
	if decoded < 10 {
		t.Fatalf("%d plugin configs decoded of %d files, want the project's examples, profiles and deploy configs", decoded, len(files))
	}
}
