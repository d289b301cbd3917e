package deviceclass_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/cli/app"
)

func run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = app.Run(context.Background(), append([]string{"deviceclass"}, args...), nil, &out, &errOut)
	return out.String(), errOut.String(), err
}

// check holds a decoded DeviceClass to what the resource's DRA names say.
func check(t *testing.T, dc resourcev1.DeviceClass, name, driver, resource string) {
	t.Helper()
	if dc.APIVersion != "resource.k8s.io/v1" || dc.Kind != "DeviceClass" || dc.Name != name {
		t.Errorf("DeviceClass %s/%s %q, want resource.k8s.io/v1/DeviceClass %q", dc.APIVersion, dc.Kind, dc.Name, name)
	}
	want := `device.driver == "` + driver + `"`
	if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil || dc.Spec.Selectors[0].CEL.Expression != want {
		t.Errorf("%s: selectors %+v, want one CEL selector %s", name, dc.Spec.Selectors, want)
	}
	if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != resource {
		t.Errorf("%s: extendedResourceName %v, want %s", name, dc.Spec.ExtendedResourceName, resource)
	}
}

// decodeYAML splits the documents and decodes each strictly.
func decodeYAML(t *testing.T, out string) []resourcev1.DeviceClass {
	t.Helper()
	var dcs []resourcev1.DeviceClass
	for _, doc := range strings.Split(out, "---\n") {
		var dc resourcev1.DeviceClass
		if err := yaml.UnmarshalStrict([]byte(doc), &dc); err != nil {
			t.Fatalf("document %q: %v", doc, err)
		}
		dcs = append(dcs, dc)
	}
	return dcs
}

func TestDeviceClassExample(t *testing.T) {
	t.Parallel()
	out, stderr, err := run(t, "--config", "../../../examples/nvidia-dra.yaml")
	if err != nil || stderr != "" {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
	dcs := decodeYAML(t, out)
	if len(dcs) != 1 {
		t.Fatalf("%d DeviceClasses, want 1:\n%s", len(dcs), out)
	}
	check(t, dcs[0], "gpu.nvidia.com", "gpu.nvidia.com", "nvidia.com/gpu")
}

// TestDeviceClassNoExtendedResource: --no-extended-resource leaves the
// name out, for clusters with kubelets before v1.36.
func TestDeviceClassNoExtendedResource(t *testing.T) {
	t.Parallel()
	out, stderr, err := run(t, "--config", "../../../examples/nvidia-dra.yaml", "--no-extended-resource")
	if err != nil || stderr != "" {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
	dcs := decodeYAML(t, out)
	if len(dcs) != 1 || dcs[0].Spec.ExtendedResourceName != nil || strings.Contains(out, "extendedResourceName") {
		t.Fatalf("DeviceClasses with --no-extended-resource:\n%s\nwant one without extendedResourceName", out)
	}
}

func TestDeviceClassFronts(t *testing.T) {
	t.Parallel()
	cfg := filepath.Join(t.TempDir(), "dra.yaml")
	if err := os.WriteFile(cfg, []byte(`apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake: {resources: [{name: example.com/foo}]}
  fronts: [dra]
  dra: {driverName: foo.dpkit.io, deviceClass: foos}
- fake: {resources: [{name: example.com/bar}]}
- amdgpu: {}
  fronts: [deviceplugin, dra]
`), 0o600); err != nil {
		t.Fatal(err)
	}

	out, _, err := run(t, "--config", cfg, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var l struct {
		APIVersion, Kind string
		Items            []resourcev1.DeviceClass
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		t.Fatalf("-o json: %v\n%s", err, out)
	}
	if l.APIVersion != "v1" || l.Kind != "List" || len(l.Items) != 2 {
		t.Fatalf("-o json: %s/%s with %d items, want a v1 List of 2:\n%s", l.APIVersion, l.Kind, len(l.Items), out)
	}
	check(t, l.Items[0], "foos", "foo.dpkit.io", "example.com/foo")
	check(t, l.Items[1], "gpu.amd.com", "gpu.amd.com", "amd.com/gpu")

	// --all: every resource, in the order of the file.
	out, _, err = run(t, "--config", cfg, "--all")
	if err != nil {
		t.Fatal(err)
	}
	dcs := decodeYAML(t, out)
	if len(dcs) != 3 {
		t.Fatalf("--all: %d DeviceClasses, want 3:\n%s", len(dcs), out)
	}
	check(t, dcs[0], "foos", "foo.dpkit.io", "example.com/foo")
	check(t, dcs[1], "bar.example.com", "bar.example.com", "example.com/bar")
	check(t, dcs[2], "gpu.amd.com", "gpu.amd.com", "amd.com/gpu")
}

func TestDeviceClassNoDRAFront(t *testing.T) {
	t.Parallel()
	out, stderr, err := run(t, "--config", "../../../examples/nvidia.yaml")
	if err != nil || out != "" || !strings.Contains(stderr, "No resource of ../../../examples/nvidia.yaml has the dra front") || !strings.Contains(stderr, "--all") {
		t.Errorf("err %v, stdout %q, stderr %q; want nothing printed and a note naming --all", err, out, stderr)
	}
	out, _, err = run(t, "--config", "../../../examples/nvidia.yaml", "-o", "json")
	if err != nil || out != "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"List\",\n  \"items\": []\n}\n" {
		t.Errorf("-o json: err %v, printed %q; want an empty List", err, out)
	}
	out, _, err = run(t, "--config", "../../../examples/nvidia.yaml", "--all")
	if err != nil {
		t.Fatal(err)
	}
	dcs := decodeYAML(t, out)
	if len(dcs) != 1 {
		t.Fatalf("--all: %d DeviceClasses, want 1", len(dcs))
	}
	check(t, dcs[0], "gpu.nvidia.com", "gpu.nvidia.com", "nvidia.com/gpu")
}

func TestDeviceClassBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--config is required"},
		{[]string{"--config", "nope.yaml"}, "does not exist"},
		{[]string{"--config", "../../../examples/nvidia.yaml", "-o", "table"}, `"table" is not a format; use yaml or json`},
		{[]string{"--config", "../../../examples/nvidia.yaml", "extra"}, "unknown command"},
	} {
		_, _, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || app.ExitCode(err) != 2 {
			t.Errorf("%v: err %v (exit %d), want exit 2 and %q", tc.args, err, app.ExitCode(err), tc.want)
		}
	}
}

// TestDeviceClassPartitioned: a resource whose devices include
// partitions gets a class of all its devices for claims, and a -whole
// class of its whole devices that serves the extended resource.
func TestDeviceClassPartitioned(t *testing.T) {
	t.Parallel()
	out, stderr, err := run(t, "--config", "../../../examples/fake-sharing.yaml")
	if err != nil || stderr != "" {
		t.Fatalf("err %v, stderr %q", err, stderr)
	}
	dcs := decodeYAML(t, out)
	if len(dcs) != 2 || dcs[0].Name != "gpu.example.com" || dcs[0].Spec.ExtendedResourceName != nil || dcs[1].Name != "gpu.example.com-whole" {
		t.Fatalf("classes %+v, want gpu.example.com without extendedResourceName and gpu.example.com-whole", dcs)
	}
	want := `device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].partition == false`
	if got := dcs[1].Spec.Selectors[0].CEL.Expression; got != want || dcs[1].Spec.ExtendedResourceName == nil || *dcs[1].Spec.ExtendedResourceName != "example.com/gpu" {
		t.Errorf("whole class: %q, %v; want %q and example.com/gpu", got, dcs[1].Spec.ExtendedResourceName, want)
	}
}
