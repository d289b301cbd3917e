package exporter

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestAMDCollector reads the mi250 fixture (the GCD at KFD node n is n*10
// % busy, draws 100+n W) for a device plugin's device, a partition of a
// GPU, a DRA device named after a GPU, and a device it does not know.
func TestAMDCollector(t *testing.T) {
	t.Parallel()
	c := AMDCollector{SysfsRoot: filepath.Join("..", "discovery", "testdata", "hosts", "mi250", "sys")}
	devs := []Device{
		{Resource: "amd.com/gpu", ID: "0000:29:00.0"},                                                                    // KFD node 2
		{Resource: "amd.com/gpu", ID: "0000:2c:00.0-p1"},                                                                 // node 3
		{Driver: "gpu.amd.com", Pool: "n", Name: "0000-a9-00-0-0123456789", ID: "gpu.amd.com/n/0000-a9-00-0-0123456789"}, // node 4
		{Resource: "example.com/foo", ID: "foo0"},
	}
	r, err := c.Collect(context.Background(), devs)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, x := range r {
		got[x.Device.ID+" "+x.Name] = x.Value
	}
	for key, want := range map[string]float64{
		"0000:29:00.0 utilization_ratio":                            0.2,
		"0000:29:00.0 power_watts":                                  102,
		"0000:29:00.0 temperature_celsius":                          42,
		"0000:29:00.0 memory_used_bytes":                            2 << 30,
		"0000:29:00.0 memory_total_bytes":                           68702699520,
		"0000:2c:00.0-p1 utilization_ratio":                         0.3,
		"gpu.amd.com/n/0000-a9-00-0-0123456789 utilization_ratio":   0.4,
		"gpu.amd.com/n/0000-a9-00-0-0123456789 temperature_celsius": 44,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (read: %v), want %v", key, v, ok, want)
		}
	}
	for key := range got {
		if strings.HasPrefix(key, "foo0 ") {
			t.Errorf("a device that is no AMD GPU has a reading: %s", key)
		}
	}
	if len(got) != 15 {
		t.Errorf("%d readings, want 15 (five for each of three GPUs): %v", len(got), got)
	}
}

// TestReadingsCarryPodLabels: a collector's readings of a held device
// have the pod's labels, a free device's have none; a reading with a bad
// name is dropped and counted.
func TestReadingsCarryPodLabels(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{allocatable: gpu("gpu0", "gpu1")}
	n.addPod("ns", "a", "main", gpu("gpu0"), nil)
	serve(t, n, socket)
	e, _ := newExporter(t, Config{Socket: socket, Collectors: []DeviceCollector{constCollector{}}})
	pods := map[string]string{}
	for _, s := range gather(t, e, "dpkit_device_utilization_ratio") {
		pods[s.labels["device_id"]] = s.labels["pod"]
	}
	if len(pods) != 2 || pods["gpu0"] != "a" || pods["gpu1"] != "" {
		t.Errorf("readings by device: %v; want gpu0 held by a and gpu1 free", pods)
	}
	errs := gather(t, e, "dpkit_exporter_collector_errors_total")
	if len(errs) != 1 || errs[0].labels["collector"] != "const" || errs[0].value == 0 {
		t.Errorf("collector errors: %v; want the bad names counted for const", errs)
	}
}

type constCollector struct{}

func (constCollector) Name() string { return "const" }
func (constCollector) Collect(_ context.Context, devs []Device) ([]Reading, error) {
	var out []Reading
	for _, d := range devs {
		out = append(out, Reading{Device: d, Name: "utilization_ratio", Value: 0.5}, Reading{Device: d, Name: "Bad-Name", Value: 1})
	}
	return out, nil
}
