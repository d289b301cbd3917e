package config

import (
	"reflect"
	"strings"
	"testing"
)

const head = "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\n"

func TestFronts(t *testing.T) {
	t.Parallel()
	cfg, err := DecodePluginConfig([]byte(head + `plugins:
- fake:
    resources:
    - name: example.com/foo
    - name: example.com/My_Bar
  fronts: [deviceplugin, dra]
- nvidia: {}
  fronts: [dra]
  dra: {driverName: gpu.dpkit.io, deviceClass: fast-gpus}
- amdgpu: {}
`))
	if err != nil {
		t.Fatal(err)
	}
	both := []string{FrontDevicePlugin, FrontDRA}
	want := []ResourceFront{
		{Kind: "fake", Resource: "example.com/foo", Fronts: both, DriverName: "foo.example.com", DeviceClass: "foo.example.com"},
		{Kind: "fake", Resource: "example.com/My_Bar", Fronts: both, DriverName: "my-bar.example.com", DeviceClass: "my-bar.example.com"},
		{Kind: "nvidia", Resource: "nvidia.com/gpu", Fronts: []string{FrontDRA}, DriverName: "gpu.dpkit.io", DeviceClass: "fast-gpus"},
		{Kind: "amdgpu", Resource: "amd.com/gpu", Fronts: []string{FrontDevicePlugin}, DriverName: "gpu.amd.com", DeviceClass: "gpu.amd.com"},
	}
	if got := cfg.Fronts(); !reflect.DeepEqual(got, want) {
		t.Errorf("Fronts() =\n%+v\nwant\n%+v", got, want)
	}
	if !cfg.UsesFront(FrontDRA) {
		t.Error("UsesFront(dra) = false")
	}
	wantDRA := DRAConfig{PluginsDir: "/var/lib/kubelet/plugins", CDIDir: "/var/run/cdi", PodResourcesSocket: "/var/lib/kubelet/pod-resources/kubelet.sock"}
	if cfg.DRA != wantDRA {
		t.Errorf("dra defaults = %+v, want %+v", cfg.DRA, wantDRA)
	}

	plain, err := DecodePluginConfig([]byte(mustRead(t, "../../examples/nvidia.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if plain.UsesFront(FrontDRA) || !reflect.DeepEqual(plain.Fronts()[0].Fronts, []string{FrontDevicePlugin}) {
		t.Errorf("examples/nvidia.yaml fronts = %+v, want [deviceplugin] only", plain.Fronts())
	}
}

func TestFrontsProblems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown and repeated fronts", `plugins:
- fake: {resources: [{name: example.com/foo}]}
  fronts: [deviceplugin, DRA, deviceplugin]
`, []string{
			"2 problem(s)",
			`plugins[0].fronts[1]: Unsupported value: "DRA": supported values: "deviceplugin", "dra"`,
			`plugins[0].fronts[2]: Duplicate value: "deviceplugin"`,
		}},
		{"empty fronts", `plugins:
- fake: {resources: [{name: example.com/foo}]}
  fronts: []
`, []string{`plugins[0].fronts: Invalid value: []: an explicit zero is not a setting here; leave the field out for the default, ["deviceplugin"]`}},
		{"a typo in a field", `plugins:
- fake: {resources: [{name: example.com/foo}]}
  front: [dra]
dra: {pluginDir: /x}
`, []string{
			`plugins[0].front: Not found: unknown field; did you mean "fronts"?`,
			`dra.pluginDir: Not found: unknown field; did you mean "pluginsDir"?`,
		}},
		{"dra names for several resources", `plugins:
- fake: {resources: [{name: example.com/foo}, {name: example.com/bar}]}
  fronts: [dra]
  dra: {driverName: foo.example.com, deviceClass: foo}
`, []string{
			"2 problem(s)",
			"plugins[0].dra.driverName: Forbidden: this entry serves 2 resources (example.com/foo, example.com/bar), which cannot share one driverName; split them into one plugins entry each",
			"plugins[0].dra.deviceClass: Forbidden: this entry serves 2 resources",
		}},
		{"MIG partitions without the dra front", `plugins:
- nvidia: {mig: partitions}
`, []string{"plugins[0].nvidia.mig: Forbidden: MIG partitions are served through DRA only"}},
		{"memory shares without the dra front", `plugins:
- nvidia: {shared: {memory: {min: 1Gi}}}
`, []string{"plugins[0].nvidia.shared: Forbidden: shares of a GPU's memory are asked for through DRA"}},
		{"a share policy of a capacity GPUs have not", `plugins:
- nvidia: {shared: {cores: {}}}
  fronts: [dra]
`, []string{`plugins[0].nvidia.shared[cores]: Unsupported value: "cores"`}},
		{"dra without the dra front", `plugins:
- nvidia: {}
  dra: {driverName: gpu.example.com}
`, []string{"plugins[0].dra: Forbidden: applies only with the dra front; add dra to fronts, or remove dra"}},
		{"bad names", `plugins:
- nvidia: {}
  fronts: [dra]
  dra: {driverName: GPU_driver, deviceClass: "a b"}
- amdgpu: {}
  fronts: [dra]
  dra: {driverName: ` + strings.Repeat("a", 60) + `.com}
`, []string{
			"3 problem(s)",
			`plugins[0].dra.driverName: Invalid value: "GPU_driver": a lowercase RFC 1123 subdomain`,
			`plugins[0].dra.deviceClass: Invalid value: "a b": must be a DeviceClass name`,
			"plugins[1].dra.driverName: Invalid value: \"" + strings.Repeat("a", 60) + `.com": must be no more than 63 characters`,
		}},
		{"a default driver name too long", `plugins:
- fake: {resources: [{name: example.com/` + strings.Repeat("a", 55) + `}]}
  fronts: [dra]
`, []string{`plugins[0].fronts: Invalid value: "dra": the default DRA driver name of example.com/` + strings.Repeat("a", 55) + `, "` + strings.Repeat("a", 55) + `.example.com", must be no more than 63 characters; set dra.driverName (in an entry of its own)`}},
		{"one driver name twice", `plugins:
- fake: {resources: [{name: example.com/gpu}]}
  fronts: [dra]
- nvidia: {}
  fronts: [dra]
  dra: {driverName: gpu.example.com}
`, []string{
			"2 problem(s)",
			`plugins[1].dra.driverName: Duplicate value: "gpu.example.com: the driver of example.com/gpu too; set dra.driverName on one of them"`,
			`plugins[1].dra.deviceClass: Duplicate value: "gpu.example.com: the DeviceClass of example.com/gpu too; set dra.deviceClass on one of them"`,
		}},
		{"the dra section", `plugins:
- fake: {resources: [{name: example.com/foo}]}
dra:
  pluginsDir: plugins
  cdiDir: ""
  nodeName: Node_1
`, []string{
			"3 problem(s)",
			`dra.pluginsDir: Invalid value: "plugins": must be an absolute path`,
			`dra.cdiDir: Invalid value: "": an explicit zero is not a setting here; leave the field out for the default, "/var/run/cdi"`,
			`dra.nodeName: Invalid value: "Node_1": must be a node name`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := DecodePluginConfig([]byte(head + tc.yaml))
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

func TestDRANode(t *testing.T) {
	t.Parallel()
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == EnvNodeName {
				return v
			}
			return ""
		}
	}
	if n, err := (DRAConfig{NodeName: "a"}).Node(env("b")); n != "a" || err != nil {
		t.Errorf("nodeName set: %q, %v", n, err)
	}
	if n, err := (DRAConfig{}).Node(env("b")); n != "b" || err != nil {
		t.Errorf("from $NODE_NAME: %q, %v", n, err)
	}
	if _, err := (DRAConfig{}).Node(env("")); err == nil || !strings.Contains(err.Error(), "set dra.nodeName, or $NODE_NAME") {
		t.Errorf("neither: %v", err)
	}
}

// TestDRAResolve: the DRA front's directories come from the file, then
// the environment, then beside a device plugin directory that is not the
// kubelet's (a dpkit node's root), then the kubelet's.
func TestDRAResolve(t *testing.T) {
	t.Parallel()
	defaults := DRAConfig{PluginsDir: DefaultDRAPluginsDir, CDIDir: DefaultCDIDir, PodResourcesSocket: DefaultPodResourcesSocket}
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		name      string
		d         DRAConfig
		env       map[string]string
		pluginDir string
		want      DRAConfig
	}{
		{"kubelet", defaults, nil, "/var/lib/kubelet/device-plugins/", defaults},
		{"no plugin dir", defaults, nil, "", defaults},
		{"beside a node's root", defaults, nil, "/tmp/r/device-plugins",
			DRAConfig{PluginsDir: "/tmp/r/plugins", CDIDir: DefaultCDIDir, PodResourcesSocket: "/tmp/r/pod-resources/kubelet.sock"}},
		{"environment first", defaults, map[string]string{EnvDRAPluginsDir: "/e/plugins", EnvCDIDir: "/e/cdi"}, "/tmp/r/device-plugins",
			DRAConfig{PluginsDir: "/e/plugins", CDIDir: "/e/cdi", PodResourcesSocket: "/tmp/r/pod-resources/kubelet.sock"}},
		{"the file first", DRAConfig{PluginsDir: "/f/plugins", CDIDir: "/f/cdi", PodResourcesSocket: "/f/pr.sock"},
			map[string]string{EnvDRAPluginsDir: "/e/plugins", EnvCDIDir: "/e/cdi"}, "/tmp/r/device-plugins",
			DRAConfig{PluginsDir: "/f/plugins", CDIDir: "/f/cdi", PodResourcesSocket: "/f/pr.sock"}},
	} {
		if got := tc.d.Resolve(env(tc.env), tc.pluginDir); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
