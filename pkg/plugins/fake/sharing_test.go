package fake_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
)

const gi = int64(1) << 30

// TestPartitionsAndShares: a partitioned, shared fake resource reports
// each device with its partitions, describes what each takes, and lists
// one counter set per device.
func TestPartitionsAndShares(t *testing.T) {
	t.Parallel()
	var cfg fake.Config
	doc := `
resources:
- name: example.com/gpu
  count: 2
  idPattern: gpu-{index}
  unhealthy: [gpu-1]
  capacity: {memory: 80Gi, slices: 7}
  partitions:
  - {profile: 1g-10gb, count: 7, consumes: {memory: 10Gi, slices: 1}}
  - {profile: 3g-40gb, count: 2, consumes: {memory: 40Gi, slices: 3}}
  shared:
    memory: {min: 1Gi, step: 1Gi}
`
	if err := yaml.UnmarshalStrict([]byte(doc), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Default()
	resources, err := fake.New(cfg, plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := resources[0].Plugin
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan []deviceplugin.Device, 1)
	go func() {
		_ = p.Scan(ctx, func(d []deviceplugin.Device) {
			select {
			case got <- d:
			default:
			}
		})
	}()
	devs := <-got
	if len(devs) != 2*(1+7+2) {
		t.Fatalf("%d devices reported, want 2 GPUs with 9 partitions each", len(devs))
	}
	for _, d := range devs {
		if strings.HasPrefix(d.ID, "gpu-1") && d.Healthy {
			t.Errorf("%s healthy, want it to follow its unhealthy GPU", d.ID)
		}
	}
	describer := p.(deviceplugin.Describer)
	whole, _ := describer.Describe("gpu-0")
	wantWhole := &deviceplugin.Sharing{
		Consumes: []deviceplugin.CounterUse{{Set: "gpu-0", Counters: map[string]int64{"memory": 80 * gi, "slices": 7}}},
		Shared:   map[string]deviceplugin.SharedCapacity{"memory": {Total: 80 * gi, Default: 80 * gi, Min: gi, Step: gi}},
	}
	if dump(whole.Sharing) != dump(wantWhole) || *whole.Attributes[fake.PartitionAttribute].Bool {
		t.Errorf("gpu-0: %s, want %s and partition false", dump(whole), dump(wantWhole))
	}
	part, ok := describer.Describe("gpu-1-3g-40gb-1")
	wantPart := &deviceplugin.Sharing{Consumes: []deviceplugin.CounterUse{{Set: "gpu-1", Counters: map[string]int64{"memory": 40 * gi, "slices": 3}}}}
	if !ok || dump(part.Sharing) != dump(wantPart) || *part.Attributes[fake.ProfileAttribute].String != "3g-40gb" ||
		*part.Attributes[fake.ParentAttribute].String != "gpu-1" || part.Capacity["memory"] != "40Gi" || !*part.Attributes[fake.PartitionAttribute].Bool {
		t.Errorf("gpu-1-3g-40gb-1: %s, want a 3g-40gb partition of gpu-1 taking 40Gi and 3 slices", dump(part))
	}
	sets := p.(deviceplugin.CounterSetter).CounterSets()
	if len(sets) != 2 || sets[1].Name != "gpu-1" || sets[1].Counters["slices"] != 7 {
		t.Errorf("counter sets %s, want one per GPU with its memory and slices", dump(sets))
	}
}

// TestValidateSharing: each mistake is named by its field.
func TestValidateSharing(t *testing.T) {
	t.Parallel()
	cfg := fake.Config{Resources: []fake.ResourceConfig{{
		Name:     "example.com/gpu",
		Capacity: map[string]string{"memory": "80Gi", "slices": "7", "Cores": "8"},
		Partitions: []fake.PartitionConfig{
			{Profile: "1g.10gb", Count: 7, Consumes: map[string]string{"memory": "10Gi", "slices": "1"}},
			{Profile: "big", Count: 1, Consumes: map[string]string{"memory": "100Gi", "disk": "1", "Cores": "1"}},
			{Profile: "none", Count: 0},
		},
		Shared: map[string]plugins.SharePolicy{"memory": {Min: "80Gi"}, "bandwidth": {}, "slices": {Default: "2", Step: "2", Min: "1"}},
	}}}
	cfg.Default()
	var got []string
	for _, e := range cfg.Validate(nil) {
		got = append(got, e.Field)
	}
	want := []string{
		"resources[0].partitions[0].profile",
		"resources[0].partitions[1].consumes[Cores]", "resources[0].partitions[1].consumes[disk]", "resources[0].partitions[1].consumes[memory]",
		"resources[0].partitions[2].count", "resources[0].partitions[2].consumes",
		"resources[0].shared[bandwidth]", "resources[0].shared[memory]", "resources[0].shared[slices]",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems at\n%q\nwant\n%q", got, want)
	}
	if _, err := plugins.ParseAmount("1.5Gi"); err == nil || !strings.Contains(err.Error(), "whole-number quantity") {
		t.Errorf("ParseAmount(1.5Gi) = %v, want it refused", err)
	}
}

// TestReplicas: with replicas, each device is also offered as replicas
// <id>::<n>, each a fixed share of it.
func TestReplicas(t *testing.T) {
	t.Parallel()
	cfg := fake.Config{Resources: []fake.ResourceConfig{{
		Name: "example.com/gpu", Count: 1, IDPattern: "gpu-{index}", Capacity: map[string]string{"memory": "80Gi"},
		Shared: map[string]plugins.SharePolicy{"memory": {Min: "1Gi", Step: "1Gi"}}, Replicas: 3,
	}}}
	cfg.Default()
	resources, err := fake.New(cfg, plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	info, ok := resources[0].Plugin.(deviceplugin.Describer).Describe("gpu-0::2")
	// 80Gi / 3, down to the 1Gi granule.
	if !ok || info.Sharing == nil || info.Sharing.ShareOf != "gpu-0" || info.Sharing.ShareAmounts["memory"] != 26*gi {
		t.Errorf("gpu-0::2: %s, want a 26Gi share of gpu-0", dump(info))
	}
	bad := cfg
	bad.Resources = []fake.ResourceConfig{cfg.Resources[0]}
	bad.Resources[0].Shared = nil
	if errs := bad.Validate(nil); len(errs) == 0 || errs[0].Field != "resources[0].shared" {
		t.Errorf("replicas without shared: %v, want resources[0].shared required", errs)
	}
}
