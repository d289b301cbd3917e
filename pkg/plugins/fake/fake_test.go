package fake_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
)

func TestFakeEndToEnd(t *testing.T) {
	cfg := fake.Config{Resources: []fake.ResourceConfig{{
		Name: "example.com/foo", Count: 8, NUMANodes: 2, Unhealthy: []string{"dev-7"},
		HealthChanges: []fake.HealthChange{
			{Device: "dev-3", After: plugins.Duration{Duration: 5 * time.Second}, Health: pluginapi.Unhealthy},
			{Device: "dev-3", After: plugins.Duration{Duration: 20 * time.Second}, Health: pluginapi.Healthy},
		},
		PreferredAllocation: fake.PreferNUMAPacked,
		PreStartRequired:    true,
		Allocate: fake.AllocateConfig{
			Envs:        map[string]string{"VISIBLE": "{ids}"},
			Mounts:      []fake.Mount{{ContainerPath: "/etc/foo", HostPath: "/var/lib/foo", ReadOnly: true}},
			Devices:     []fake.DeviceNode{{ContainerPath: "/dev/foo{index}", HostPath: "/dev/null"}},
			CDIDevices:  []string{"example.com/foo={id}"},
			Annotations: map[string]string{"example.com/devices": "{ids}"},
		},
	}, {Name: "example.com/bar", Count: 2, IDPattern: "bar-{index}"}}}
	cfg.Default()
	clk := clocktesting.NewFakeClock(time.Now())
	resources, err := fake.NewWithClock(cfg, plugins.Options{}, clk)
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, resources...)

	devs := k.WaitForDevices(t, "example.com/foo", dptest.Healthy(7))
	if devs[0].Topology.Nodes[0].ID != 0 || devs[4].Topology.Nodes[0].ID != 1 {
		t.Errorf("NUMA layout: dev-0 on %v, dev-4 on %v; want 0 and 1", devs[0].Topology, devs[4].Topology)
	}
	k.WaitForDevices(t, "example.com/bar", func(d []*pluginapi.Device) bool { return len(d) == 2 && d[1].ID == "bar-1" })
	if opts := k.Plugin("example.com/foo").Options; !opts.GetPreferredAllocationAvailable || !opts.PreStartRequired {
		t.Errorf("options = %+v", opts)
	}
	if opts := k.Plugin("example.com/bar").Options; opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Errorf("bar options = %+v, want none", opts)
	}

	// Health follows the schedule on the plugin's clock.
	clk.Step(5 * time.Second)
	k.WaitForDevices(t, "example.com/foo", dptest.Health("dev-3", pluginapi.Unhealthy))
	clk.Step(15 * time.Second)
	k.WaitForDevices(t, "example.com/foo", dptest.Health("dev-3", pluginapi.Healthy))

	ctx := context.Background()
	resp, err := k.Allocate(ctx, "example.com/foo", "dev-1", "dev-2")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Envs[fake.EnvDevices] != "dev-1,dev-2" || resp.Envs["VISIBLE"] != "dev-1,dev-2" {
		t.Errorf("envs = %v", resp.Envs)
	}
	if len(resp.Devices) != 2 || resp.Devices[1].ContainerPath != "/dev/foo2" || resp.Devices[1].Permissions != "rw" {
		t.Errorf("devices = %v", resp.Devices)
	}
	if len(resp.CdiDevices) != 2 || resp.CdiDevices[0].Name != "example.com/foo=dev-1" {
		t.Errorf("cdi = %v", resp.CdiDevices)
	}
	if len(resp.Mounts) != 1 || !resp.Mounts[0].ReadOnly || resp.Annotations["example.com/devices"] != "dev-1,dev-2" {
		t.Errorf("mounts = %v annotations = %v", resp.Mounts, resp.Annotations)
	}
	if _, err := k.Allocate(ctx, "example.com/foo", "dev-7"); err == nil || !strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("allocating the unhealthy dev-7: %v", err)
	}

	pref, err := k.Client(t, "example.com/foo").GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-4", "dev-5", "dev-6"}, AllocationSize: 3,
		}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(pref.ContainerResponses[0].DeviceIDs, ","); got != "dev-4,dev-5,dev-6" {
		t.Errorf("numa-packed preferred = %s, want dev-4,dev-5,dev-6 (all on node 1)", got)
	}
	barResp, err := k.Allocate(ctx, "example.com/bar", "bar-0")
	if err != nil || barResp.Envs[fake.EnvDevices] != "bar-0" {
		t.Errorf("bar allocate = %v, %v", barResp, err)
	}
}

// TestScanEndsWithItsSchedule: a fake with no health change left to make
// returns from Scan, its device set final, without waiting for its
// context; one with changes returns after reporting the last.
func TestScanEndsWithItsSchedule(t *testing.T) {
	cfg := fake.Config{Resources: []fake.ResourceConfig{{
		Name: "example.com/foo", Count: 2,
		HealthChanges: []fake.HealthChange{{Device: "dev-1", After: plugins.Duration{Duration: time.Minute}, Health: pluginapi.Unhealthy}},
	}, {Name: "example.com/bar", Count: 1}}}
	cfg.Default()
	clk := clocktesting.NewFakeClock(time.Now())
	resources, err := fake.NewWithClock(cfg, plugins.Options{}, clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	scan := func(p deviceplugin.Plugin) (<-chan error, <-chan []deviceplugin.Device) {
		ended, reports := make(chan error, 1), make(chan []deviceplugin.Device, 2)
		go func() { ended <- p.Scan(ctx, func(d []deviceplugin.Device) { reports <- d }) }()
		return ended, reports
	}

	ended, reports := scan(resources[1].Plugin)
	if err := <-ended; err != nil {
		t.Fatalf("Scan of a fake without a schedule: %v, want nil", err)
	}
	if d := <-reports; len(d) != 1 || !d[0].Healthy {
		t.Errorf("reported %+v before ending, want one healthy device", d)
	}

	ended, reports = scan(resources[0].Plugin)
	if d := <-reports; len(d) != 2 || !d[1].Healthy {
		t.Fatalf("first report %+v, want two healthy devices", d)
	}
	select {
	case err := <-ended:
		t.Fatalf("Scan ended (%v) with a health change still to make", err)
	default:
	}
	clk.Step(time.Minute)
	if err := <-ended; err != nil {
		t.Fatalf("Scan after its last change: %v, want nil", err)
	}
	if d := <-reports; len(d) != 2 || d[1].Healthy {
		t.Errorf("last report %+v, want dev-1 unhealthy", d)
	}
}

func TestAllocateError(t *testing.T) {
	cfg := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo", Allocate: fake.AllocateConfig{Error: "out of fake contexts"}}}}
	cfg.Default()
	resources, err := fake.New(cfg, plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, resources...)
	k.WaitForDevices(t, "example.com/foo", dptest.Count(8))
	if _, err := k.Allocate(context.Background(), "example.com/foo", "dev-0"); err == nil || !strings.Contains(err.Error(), "out of fake contexts") {
		t.Errorf("Allocate error = %v", err)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	cfg := fake.Config{Resources: []fake.ResourceConfig{{
		Name: "foo", Count: -1, IDPattern: "dev", NUMANodes: -2,
		Unhealthy:           []string{"nope"},
		HealthChanges:       []fake.HealthChange{{Device: "x", Health: "Sick", After: plugins.Duration{Duration: -time.Second}}},
		PreferredAllocation: "random",
		Allocate: fake.AllocateConfig{
			Mounts:     []fake.Mount{{}},
			Devices:    []fake.DeviceNode{{Permissions: "x"}},
			CDIDevices: []string{"nope"},
		},
	}}}
	errs := cfg.Validate(nil)
	got := errs.ToAggregate().Error()
	for _, want := range []string{
		"resources[0].name", "resources[0].count", "resources[0].idPattern", "resources[0].numaNodes",
		"resources[0].unhealthy[0]", "resources[0].healthChanges[0].device", "resources[0].healthChanges[0].after",
		"resources[0].healthChanges[0].health", "resources[0].preferredAllocation",
		"resources[0].allocate.mounts[0].containerPath", "resources[0].allocate.mounts[0].hostPath",
		"resources[0].allocate.devices[0].permissions", "resources[0].allocate.cdiDevices[0]",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("validation errors do not mention %s:\n%s", want, got)
		}
	}
	empty := fake.Config{}
	if errs := empty.Validate(nil); len(errs) != 1 {
		t.Errorf("empty config: %v", errs)
	}
}

// TestDescribe: attributes are typed as YAML writes them, and every device
// gets them with its index.
func TestDescribe(t *testing.T) {
	t.Parallel()
	var cfg fake.Config
	doc := `
resources:
- name: example.com/foo
  count: 3
  idPattern: gpu-{index}
  preferredAllocation: first
  attributes: {model: fake-a100, generation: 3, ecc: true, code: "3"}
  capacity: {memory: 80Gi}
`
	if err := yaml.UnmarshalStrict([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Default()
	resources, err := fake.New(cfg, plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, ok := resources[0].Plugin.(deviceplugin.Describer)
	if !ok {
		t.Fatalf("%T is not a deviceplugin.Describer", resources[0].Plugin)
	}
	got, ok := d.Describe("gpu-2")
	want := deviceplugin.DeviceInfo{
		Attributes: map[string]deviceplugin.Attribute{
			"model":      deviceplugin.StringAttr("fake-a100"),
			"generation": deviceplugin.IntAttr(3),
			"ecc":        deviceplugin.BoolAttr(true),
			"code":       deviceplugin.StringAttr("3"),
			"index":      deviceplugin.IntAttr(2),
		},
		Capacity: map[string]string{"memory": "80Gi"},
	}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("Describe(gpu-2) = %s, %v; want %s", dump(got), ok, dump(want))
	}
	if _, ok := d.Describe("gpu-3"); ok {
		t.Error("Describe(gpu-3) of 3 devices is known")
	}

	for _, bad := range []string{"1.5", "[a]", "{a: b}", "99999999999999999999"} {
		var c fake.Config
		err := yaml.UnmarshalStrict([]byte("resources: [{name: example.com/foo, attributes: {x: "+bad+"}}]"), &c)
		if err == nil || !strings.Contains(err.Error(), "must be a string, a whole number or true/false") {
			t.Errorf("attribute %s: %v, want it refused", bad, err)
		}
	}
}

func TestValidateDescription(t *testing.T) {
	t.Parallel()
	attrs := map[string]fake.AttributeValue{
		"index":                             {Attribute: deviceplugin.IntAttr(1)},
		"9lives":                            {Attribute: deviceplugin.StringAttr("x")},
		"memory":                            {Attribute: deviceplugin.StringAttr("x")},
		"empty":                             {},
		"a23456789012345678901234567890123": {Attribute: deviceplugin.BoolAttr(true)},
	}
	cfg := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo", Attributes: attrs, Capacity: map[string]string{"memory": "80Gi", "cores": "many"}}}}
	cfg.Default()
	var got []string
	for _, e := range cfg.Validate(nil) {
		got = append(got, e.Field)
	}
	want := []string{
		"resources[0].attributes[9lives]", "resources[0].attributes[a23456789012345678901234567890123]",
		"resources[0].attributes[empty]", "resources[0].attributes[index]",
		"resources[0].capacity[cores]", "resources[0].capacity[memory]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems at %q, want %q", got, want)
	}

	many := make(map[string]fake.AttributeValue)
	for i := range 32 {
		many[fmt.Sprintf("a%d", i)] = fake.AttributeValue{Attribute: deviceplugin.IntAttr(1)}
	}
	cfg = fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo", Attributes: many}}}
	cfg.Default()
	if errs := cfg.Validate(nil); len(errs) != 1 || !strings.Contains(errs[0].Error(), "at most 32 attributes and capacities, index included; this resource gives 33") {
		t.Errorf("33 attributes: %v", errs)
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestAllocateFailures: scripted failures fail as many calls as they
// count, once their time on the plugin's clock has come.
func TestAllocateFailures(t *testing.T) {
	t.Parallel()
	one := 1
	cfg := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo", Allocate: fake.AllocateConfig{Failures: []fake.AllocateFailure{
		{Message: "first call fails", Count: &one},
		{Message: "broken from 10s on", After: plugins.Duration{Duration: 10 * time.Second}},
	}}}}}
	cfg.Default()
	clk := clocktesting.NewFakeClock(time.Now())
	resources, err := fake.NewWithClock(cfg, plugins.Options{}, clk)
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, resources...)
	k.WaitForDevices(t, "example.com/foo", dptest.Count(8))
	ctx := context.Background()
	allocate := func(want string) {
		t.Helper()
		_, err := k.Allocate(ctx, "example.com/foo", "dev-0")
		switch {
		case want == "" && err != nil:
			t.Errorf("Allocate: %v, want success", err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("Allocate: %v, want %q", err, want)
		}
	}
	allocate("first call fails")
	allocate("")
	allocate("")
	clk.Step(10 * time.Second)
	allocate("broken from 10s on")
	allocate("broken from 10s on")

	zero := 0
	bad := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo", Allocate: fake.AllocateConfig{
		Error:    "always",
		Failures: []fake.AllocateFailure{{Count: &zero, After: plugins.Duration{Duration: -time.Second}}},
	}}}}
	bad.Default()
	var got []string
	for _, e := range bad.Validate(nil) {
		got = append(got, e.Field)
	}
	want := []string{
		"resources[0].allocate.failures[0].message", "resources[0].allocate.failures[0].after",
		"resources[0].allocate.failures[0].count", "resources[0].allocate.failures",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems at %q, want %q", got, want)
	}
}
