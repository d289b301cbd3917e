package draverify

import (
	"slices"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestFitTogether: of a GPU, its partitions and a device without
// counters, the checks hold the partitions that fit the GPU at once (the
// smallest first) and the other device, never the GPU beside them.
func TestFitTogether(t *testing.T) {
	consume := func(name string, mem, slices string) resourcev1.Device {
		return resourcev1.Device{Name: name, ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: "gpu-0", Counters: map[string]resourcev1.Counter{
			"memory": {Value: resource.MustParse(mem)}, "slices": {Value: resource.MustParse(slices)},
		}}}}
	}
	sl := []resourcev1.ResourceSlice{
		{Spec: resourcev1.ResourceSliceSpec{SharedCounters: []resourcev1.CounterSet{{Name: "gpu-0", Counters: map[string]resourcev1.Counter{
			"memory": {Value: resource.MustParse("80Gi")}, "slices": {Value: resource.MustParse("7")},
		}}}}},
		{Spec: resourcev1.ResourceSliceSpec{Devices: []resourcev1.Device{
			consume("gpu-0", "80Gi", "7"), consume("gpu-0-3g-0", "40Gi", "3"), consume("gpu-0-3g-1", "40Gi", "3"),
			consume("gpu-0-1g-0", "10Gi", "1"), consume("gpu-0-1g-1", "10Gi", "1"), {Name: "nic-0"},
		}}},
	}
	names := []string{"gpu-0", "gpu-0-1g-0", "gpu-0-1g-1", "gpu-0-3g-0", "gpu-0-3g-1", "nic-0"}
	got := fitTogether(sl, names)
	if want := []string{"gpu-0-1g-0", "gpu-0-1g-1", "gpu-0-3g-0", "nic-0"}; !slices.Equal(got, want) {
		t.Errorf("fitTogether = %v, want %v", got, want)
	}
	if got := fitTogether(nil, []string{"a", "b"}); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("without counters: %v, want every device", got)
	}
}
