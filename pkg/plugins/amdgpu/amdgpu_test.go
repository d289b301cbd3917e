package amdgpu_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/inventory"
	"github.com/dpkit/dpkit/pkg/inventory/invtest"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/amdgpu"
)

const hosts = "../../discovery/testdata/hosts"

func copyHost(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(hosts, name)+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("copy fixture: %v: %s", err, out)
	}
	return dst
}

func serve(t *testing.T, root string, cfg amdgpu.Config) *dptest.Kubelet {
	t.Helper()
	cfg.Default()
	res, err := amdgpu.New(cfg, plugins.Options{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc")})
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, res...)
	return k
}

func TestValidate(t *testing.T) {
	t.Parallel()
	c := amdgpu.Config{ResourceName: "bad name", ComputePartition: "XPX", RescanInterval: plugins.Duration{Duration: time.Millisecond}}
	errs := c.Validate(field.NewPath("amdgpu"))
	var got []string
	for _, e := range errs {
		got = append(got, e.Field)
	}
	want := []string{"amdgpu.resourceName", "amdgpu.rescanInterval", "amdgpu.computePartition"}
	if !slices.Equal(got, want) {
		t.Errorf("errors at %v, want %v", got, want)
	}
	c = amdgpu.Config{}
	c.Default()
	if errs := c.Validate(nil); len(errs) != 0 || c.ResourceName != "amd.com/gpu" {
		t.Errorf("defaults: %v, %+v", errs, c)
	}
}

func TestMI250(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "mi250"), amdgpu.Config{})
	devs := k.WaitForDevices(t, "amd.com/gpu", dptest.Healthy(4))
	want := map[string]int64{"0000:29:00.0": 0, "0000:2c:00.0": 0, "0000:a9:00.0": 1, "0000:ac:00.0": 1}
	for _, d := range devs {
		node, ok := want[d.ID]
		if !ok || d.Topology == nil || d.Topology.Nodes[0].ID != node {
			t.Errorf("device %s topology %v", d.ID, d.Topology)
		}
	}
	ctx := context.Background()
	resp, err := k.Allocate(ctx, "amd.com/gpu", "0000:29:00.0", "0000:a9:00.0")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, d := range resp.Devices {
		nodes = append(nodes, d.HostPath)
		if d.ContainerPath != d.HostPath || d.Permissions != "rw" {
			t.Errorf("device spec %v", d)
		}
	}
	if w := []string{"/dev/kfd", "/dev/dri/renderD128", "/dev/dri/card1", "/dev/dri/renderD130", "/dev/dri/card3"}; !slices.Equal(nodes, w) {
		t.Errorf("nodes %v, want %v", nodes, w)
	}
	pref, err := k.Client(t, "amd.com/gpu").GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: []string{"0000:29:00.0", "0000:a9:00.0", "0000:ac:00.0"}, AllocationSize: 2,
		}},
	})
	if err != nil || !slices.Equal(pref.ContainerResponses[0].DeviceIDs, []string{"0000:a9:00.0", "0000:ac:00.0"}) {
		t.Errorf("preferred %v, %v; want both GPUs of NUMA node 1", pref, err)
	}
}

func TestOmitCardNodes(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "mi250"), amdgpu.Config{OmitCardNodes: true})
	k.WaitForDevices(t, "amd.com/gpu", dptest.Healthy(4))
	resp, err := k.Allocate(context.Background(), "amd.com/gpu", "0000:ac:00.0")
	if err != nil || len(resp.Devices) != 2 || resp.Devices[1].HostPath != "/dev/dri/renderD131" {
		t.Errorf("allocation %v, %v", resp, err)
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	root := copyHost(t, "mi250")
	k := serve(t, root, amdgpu.Config{ComputePartition: "SPX", RescanInterval: plugins.Duration{Duration: 100 * time.Millisecond}})
	const res = "amd.com/gpu"
	k.WaitForDevices(t, res, dptest.Healthy(4))
	dev := filepath.Join(root, "dev")
	if err := os.Remove(filepath.Join(dev, "dri/renderD130")); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Health("0000:a9:00.0", pluginapi.Unhealthy))
	k.WaitForDevices(t, res, dptest.Healthy(3))
	if err := os.WriteFile(filepath.Join(dev, "dri/renderD130"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Healthy(4))

	// A GPU switched to another compute partition mode.
	pciDir, err := filepath.EvalSymlinks(filepath.Join(root, "sys/bus/pci/devices/0000:2c:00.0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pciDir, "current_compute_partition"), []byte("CPX\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Health("0000:2c:00.0", pluginapi.Unhealthy))
	if err := os.WriteFile(filepath.Join(pciDir, "current_compute_partition"), []byte("SPX\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Healthy(4))

	// A GPU that falls off the bus stays listed, unhealthy.
	if err := os.RemoveAll(filepath.Join(root, "sys/devices/virtual/kfd/kfd/topology/nodes/5")); err != nil {
		t.Fatal(err)
	}
	devs := k.WaitForDevices(t, res, dptest.Health("0000:ac:00.0", pluginapi.Unhealthy))
	if len(devs) != 4 {
		t.Errorf("%d devices after a GPU vanished, want 4", len(devs))
	}
	if _, err := k.Allocate(context.Background(), res, "0000:ac:00.0"); err == nil {
		t.Error("allocating a vanished GPU succeeded")
	}
	// Without /dev/kfd no GPU is usable.
	if err := os.Remove(filepath.Join(dev, "kfd")); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Healthy(0))
}

func TestNoGPUs(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "laptop"), amdgpu.Config{})
	k.WaitForDevices(t, "amd.com/gpu", dptest.Count(0))
}

var _ deviceplugin.PreferredAllocator = (*amdgpu.Plugin)(nil)

func TestDescribe(t *testing.T) {
	t.Parallel()
	root := filepath.Join(hosts, "mi250")
	cfg := amdgpu.Config{}
	cfg.Default()
	res, err := amdgpu.New(cfg, plugins.Options{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc")})
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, res...)
	k.WaitForDevices(t, "amd.com/gpu", dptest.Healthy(4))
	d, ok := res[0].Plugin.(deviceplugin.Describer)
	if !ok {
		t.Fatalf("%T is not a deviceplugin.Describer", res[0].Plugin)
	}
	info, ok := d.Describe("0000:29:00.0")
	if !ok {
		t.Fatal("Describe(0000:29:00.0): unknown")
	}
	want := deviceplugin.DeviceInfo{
		PCIBusID: "0000:29:00.0",
		Attributes: map[string]deviceplugin.Attribute{
			"deviceID":    deviceplugin.StringAttr("740c"),
			"productName": deviceplugin.StringAttr("AMD Instinct MI250X/MI250"),
			"uniqueID":    deviceplugin.StringAttr("8829184918163153002"),
			"renderMinor": deviceplugin.IntAttr(128),
			"partition":   deviceplugin.BoolAttr(false),
		},
	}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("Describe(0000:29:00.0) =\n%s\nwant\n%s", dump(info), dump(want))
	}
	if _, ok := d.Describe("0000:03:00.0"); ok {
		t.Error("Describe(0000:03:00.0), not a GPU, is known")
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestComputePartitions serves 8 MI300X in the CPX mode through one
// inventory: each GPU's 8 partitions are devices of the device plugin
// front, and partitions of one counter set of 8 XCCs on the DRA front.
func TestComputePartitions(t *testing.T) {
	t.Parallel()
	root := filepath.Join(hosts, "mi300x")
	cfg := amdgpu.Config{ComputePartition: "CPX"}
	cfg.Default()
	res, err := amdgpu.New(cfg, plugins.Options{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc")})
	if err != nil {
		t.Fatal(err)
	}
	inv := invtest.Run(t, "amd.com/gpu", res[0].Plugin)
	ctx := context.Background()
	devs, sets, _ := inv.DRAView()
	if len(devs) != 64 || len(sets) != 8 || sets[0].Name != "0000:05:00.0" || sets[0].Counters[amdgpu.CounterXCC] != 8 {
		t.Fatalf("%d devices and sets %s published, want 64 partitions and 8 sets of 8 XCCs", len(devs), dump(sets))
	}
	for _, d := range devs {
		if !d.Healthy || d.Sharing == nil || d.Sharing.Consumes[0].Counters[amdgpu.CounterXCC] != 1 {
			t.Fatalf("partition %s = %s, want healthy, taking 1 XCC", d.ID, dump(d))
		}
	}
	info, _ := res[0].Plugin.(deviceplugin.Describer).Describe("0000:26:00.0-p7")
	if *info.Attributes[amdgpu.AttrProfile].String != "CPX" || *info.Attributes[amdgpu.AttrParent].String != "0000:26:00.0" ||
		!*info.Attributes[amdgpu.AttrPartition].Bool || *info.Attributes["memoryPartition"].String != "NPS4" {
		t.Errorf("partition 0000:26:00.0-p7 = %s", dump(info))
	}

	// The device plugin front offers partitions, as amd.com/gpu has
	// always counted them, and holds them on the same ledger.
	front := inv.DevicePluginFront()
	if _, err := front.Allocate(ctx, []string{"0000:05:00.0-p0", "0000:05:00.0-p1"}); err != nil {
		t.Fatal(err)
	}
	claim := inventory.ClaimHolder("ml", "c", "u")
	if err := inv.Acquire([]string{"0000:05:00.0-p1"}, claim); err == nil {
		t.Error("a claim got a partition the device plugin front holds")
	}
	if err := inv.Acquire([]string{"0000:05:00.0-p2"}, claim); err != nil {
		t.Errorf("a claim on a free partition of the same GPU: %v", err)
	}
	devs, sets, _ = inv.DRAView()
	if len(devs) != 62 || sets[0].Counters[amdgpu.CounterXCC] != 6 {
		t.Errorf("after 2 partitions held through the device plugin: %d devices, %s; want 62 and 6 XCCs left", len(devs), dump(sets[0]))
	}
}
