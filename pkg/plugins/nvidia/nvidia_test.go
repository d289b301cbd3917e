package nvidia_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	nv "github.com/dpkit/dpkit/pkg/discovery/nvidia"
	"github.com/dpkit/dpkit/pkg/inventory"
	"github.com/dpkit/dpkit/pkg/inventory/invtest"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/nvidia"
)

const (
	hosts = "../../discovery/testdata/hosts"
	res   = "nvidia.com/gpu"
)

// uuid is the UUID of GPU i in the dgx-h100 fixture.
func uuid(i int) string { return fmt.Sprintf("GPU-%08x-7d2c-4d11-9b3e-0a1b2c3d4e5%d", 0x5e1a0000+i, i) }

func copyHost(t *testing.T, name string) string {
	t.Helper()
	dst := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join(hosts, name)+"/.", dst).CombinedOutput(); err != nil {
		t.Fatalf("copy fixture: %v: %s", err, out)
	}
	return dst
}

func opts(root string) plugins.Options {
	return plugins.Options{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev"), ProcRoot: filepath.Join(root, "proc")}
}

func serve(t *testing.T, root string, cfg nvidia.Config, hc nvidia.HealthChecker) *dptest.Kubelet {
	t.Helper()
	cfg.Default()
	r, err := nvidia.NewWithHealthChecker(cfg, opts(root), hc)
	if err != nil {
		t.Fatal(err)
	}
	// As dpkit plugin serves a resource through the device plugin API
	// alone.
	for i := range r {
		r[i].Plugin = inventory.DevicePluginOnly(r[i].Plugin)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, r...)
	return k
}

func preferred(t *testing.T, k *dptest.Kubelet, avail, must []string, size int) []string {
	t.Helper()
	resp, err := k.Client(t, res).GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: avail, MustIncludeDeviceIDs: must, AllocationSize: int32(size)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return resp.ContainerResponses[0].DeviceIDs
}

func TestValidate(t *testing.T) {
	t.Parallel()
	c := nvidia.Config{
		ResourceName:               "nvidia.com/",
		DeviceListStrategy:         []string{"envvar", "volume-mounts", "envvar", "cdi"},
		CDIKind:                    "nvidia",
		Replicas:                   1000,
		RescanInterval:             plugins.Duration{Duration: time.Millisecond},
		FailRequestsGreaterThanOne: false,
	}
	var got []string
	for _, e := range c.Validate(field.NewPath("nvidia")) {
		got = append(got, e.Field)
	}
	want := []string{"nvidia.resourceName", "nvidia.deviceListStrategy[1]", "nvidia.deviceListStrategy[2]", "nvidia.cdiKind", "nvidia.replicas", "nvidia.rescanInterval"}
	if !slices.Equal(got, want) {
		t.Errorf("errors at %v, want %v", got, want)
	}
	c = nvidia.Config{FailRequestsGreaterThanOne: true}
	c.Default()
	if errs := c.Validate(nil); len(errs) != 1 || errs[0].Field != "failRequestsGreaterThanOne" {
		t.Errorf("failRequestsGreaterThanOne without replicas: %v", errs)
	}
	for _, tc := range []struct {
		cfg  nvidia.Config
		want string
	}{
		{nvidia.Config{CDISpecDir: "/var/run/cdi"}, "add cdi to deviceListStrategy"},
		{nvidia.Config{CDISpecDir: "run/cdi", DeviceListStrategy: []string{"cdi"}}, "must be an absolute path"},
	} {
		tc.cfg.Default()
		if errs := tc.cfg.Validate(nil); len(errs) != 1 || errs[0].Field != "cdiSpecDir" || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("cdiSpecDir %q with %v: %v, want one error saying %q", tc.cfg.CDISpecDir, tc.cfg.DeviceListStrategy, errs, tc.want)
		}
	}
	for _, tc := range []struct {
		cfg  nvidia.Config
		want string
	}{
		{nvidia.Config{MIG: "mixed"}, `supported values: "partitions"`},
		{nvidia.Config{MIG: nvidia.MIGPartitions, Replicas: 2}, "remove replicas or mig"},
	} {
		tc.cfg.Default()
		if errs := tc.cfg.Validate(nil); len(errs) != 1 || errs[0].Field != "mig" || !strings.Contains(errs[0].Error(), tc.want) {
			t.Errorf("mig %q, replicas %d: %v, want one error saying %q", tc.cfg.MIG, tc.cfg.Replicas, errs, tc.want)
		}
	}
}

// TestCDISpec: with cdiSpecDir the plugin writes a CDI spec with valid
// names (containerd's reading of it is TestRealNodeNvidiaCDI's): one device per GPU, named as Allocate names it, with
// its node and device numbers; the control, UVM and modeset nodes for
// all. A GPU that falls off the bus leaves the spec.
func TestCDISpec(t *testing.T) {
	t.Parallel()
	root := copyHost(t, "dgx-h100")
	// /dev/nvidia0 a character device (the fixture's are plain files).
	if err := os.Remove(filepath.Join(root, "dev", "nvidia0")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/null", filepath.Join(root, "dev", "nvidia0")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "cdi")
	k := serve(t, root, nvidia.Config{DeviceListStrategy: []string{"cdi"}, CDIKind: "example.com/gpu", CDISpecDir: dir, RescanInterval: plugins.Duration{Duration: 100 * time.Millisecond}}, nil)
	k.WaitForDevices(t, res, dptest.Healthy(8))
	file := filepath.Join(dir, plugins.CDISpecFile("example.com/gpu"))
	read := func() map[string]cdispec.Device {
		t.Helper()
		var spec cdispec.Spec
		if err := json.Unmarshal(mustRead(t, file), &spec); err != nil {
			t.Fatal(err)
		}
		if spec.Version != plugins.CDIVersion || spec.Kind != "example.com/gpu" {
			t.Errorf("spec version %q kind %q, want %s example.com/gpu", spec.Version, spec.Kind, plugins.CDIVersion)
		}
		var common []string
		for _, n := range spec.ContainerEdits.DeviceNodes {
			common = append(common, n.Path)
		}
		if want := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"}; !slices.Equal(common, want) {
			t.Errorf("nodes for every GPU %v, want %v", common, want)
		}
		devs := map[string]cdispec.Device{}
		for _, d := range spec.Devices {
			if err := parser.ValidateDeviceName(d.Name); err != nil {
				t.Errorf("device name %q: %v", d.Name, err)
			}
			devs[d.Name] = d
		}
		return devs
	}
	spec := read()
	if len(spec) != 8 {
		t.Fatalf("spec with %d devices, want 8", len(spec))
	}
	r, err := k.Allocate(context.Background(), res, uuid(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := spec[strings.TrimPrefix(r.CdiDevices[0].Name, "example.com/gpu=")]; len(r.CdiDevices) != 1 || !ok {
		t.Fatalf("Allocate names %v, which the spec does not have", r.CdiDevices)
	}
	nodes := spec[uuid(0)].ContainerEdits.DeviceNodes
	if len(nodes) != 1 || nodes[0].Path != "/dev/nvidia0" || nodes[0].HostPath != "/dev/nvidia0" || nodes[0].Type != "c" || nodes[0].Major != 1 || nodes[0].Minor != 3 {
		t.Errorf("GPU 0's nodes %+v, want /dev/nvidia0, a character device 1:3 (the symlink's /dev/null)", nodes[0])
	}
	if n := spec[uuid(1)].ContainerEdits.DeviceNodes; len(n) != 1 || n[0].Path != "/dev/nvidia1" || n[0].Type != "" {
		t.Errorf("GPU 1's nodes %+v, want /dev/nvidia1 without numbers (a plain file in the fixture)", n[0])
	}
	// GPU 7 falls off the bus: it leaves the spec at the rescan that sees it.
	gpus := filepath.Join(root, "proc", "driver", "nvidia", "gpus")
	entries, err := os.ReadDir(gpus)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(gpus, entries[len(entries)-1].Name())); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Healthy(7))
	if spec := read(); len(spec) != 7 {
		t.Errorf("after a GPU vanished the spec has %d devices, want 7", len(spec))
	}
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDGX(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "dgx-h100"), nvidia.Config{DeviceListStrategy: []string{"envvar", "device-specs", "cdi"}}, nil)
	devs := k.WaitForDevices(t, res, dptest.Healthy(8))
	for i, d := range devs {
		if d.ID != uuid(i) || d.Topology == nil || d.Topology.Nodes[0].ID != int64(i/4) {
			t.Errorf("device %d = %v", i, d)
		}
	}
	r, err := k.Allocate(context.Background(), res, uuid(5), uuid(1))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Envs[nvidia.EnvVisibleDevices]; got != uuid(5)+","+uuid(1) {
		t.Errorf("%s = %q", nvidia.EnvVisibleDevices, got)
	}
	var nodes []string
	for _, d := range r.Devices {
		nodes = append(nodes, d.HostPath)
	}
	if want := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset", "/dev/nvidia5", "/dev/nvidia1"}; !slices.Equal(nodes, want) {
		t.Errorf("nodes %v, want %v", nodes, want)
	}
	if len(r.CdiDevices) != 2 || r.CdiDevices[0].Name != "nvidia.com/gpu="+uuid(5) {
		t.Errorf("CDI devices %v", r.CdiDevices)
	}

	all := make([]string, 8)
	for i := range all {
		all[i] = uuid(i)
	}
	tests := []struct {
		name  string
		avail []int
		must  []int
		size  int
		want  []int
	}{
		{"four fit on node 0", []int{0, 1, 2, 3, 4, 5, 6, 7}, nil, 4, []int{0, 1, 2, 3}},
		{"best fit picks the emptier node", []int{0, 4, 5, 6, 7, 1, 2}, nil, 3, []int{0, 1, 2}},
		{"mustInclude on node 1", []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{6}, 2, []int{6, 4}},
		{"six span two nodes", []int{0, 1, 2, 3, 4, 5, 6, 7}, nil, 6, []int{0, 1, 2, 3, 4, 5}},
	}
	for _, tt := range tests {
		pick := func(ix []int) []string {
			var out []string
			for _, i := range ix {
				out = append(out, uuid(i))
			}
			return out
		}
		if got := preferred(t, k, pick(tt.avail), pick(tt.must), tt.size); !slices.Equal(got, pick(tt.want)) {
			t.Errorf("%s: got %v, want %v", tt.name, got, pick(tt.want))
		}
	}
}

func TestReplicas(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "dgx-h100"), nvidia.Config{Replicas: 4, DeviceListStrategy: []string{"cdi"}}, nil)
	devs := k.WaitForDevices(t, res, dptest.Healthy(32))
	if devs[0].ID != uuid(0)+"::0" || devs[31].ID != uuid(7)+"::3" {
		t.Errorf("replica IDs %s ... %s", devs[0].ID, devs[31].ID)
	}
	r, err := k.Allocate(context.Background(), res, uuid(2)+"::1", uuid(2)+"::3", uuid(3)+"::0")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.CdiDevices) != 2 || r.CdiDevices[0].Name != "nvidia.com/gpu="+uuid(2) || r.CdiDevices[1].Name != "nvidia.com/gpu="+uuid(3) || r.Envs != nil {
		t.Errorf("replica allocation %v", r)
	}
	var avail []string
	for _, d := range devs {
		avail = append(avail, d.ID)
	}
	got := preferred(t, k, avail, nil, 3)
	if want := []string{uuid(0) + "::0", uuid(1) + "::0", uuid(2) + "::0"}; !slices.Equal(got, want) {
		t.Errorf("preferred replicas %v, want one per GPU on node 0: %v", got, want)
	}
}

func TestFailRequestsGreaterThanOne(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "dgx-h100"), nvidia.Config{Replicas: 2, FailRequestsGreaterThanOne: true}, nil)
	k.WaitForDevices(t, res, dptest.Healthy(16))
	_, err := k.Allocate(context.Background(), res, uuid(0)+"::0", uuid(0)+"::1")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "failRequestsGreaterThanOne") {
		t.Errorf("Allocate of 2 replicas = %v", err)
	}
	if _, err := k.Allocate(context.Background(), res, uuid(0)+"::1"); err != nil {
		t.Errorf("Allocate of 1 replica = %v", err)
	}
}

type checker struct {
	started chan []nv.GPU
	report  chan func(string, bool, string)
}

func (c *checker) Run(ctx context.Context, gpus []nv.GPU, report func(string, bool, string)) error {
	c.started <- gpus
	c.report <- report
	<-ctx.Done()
	return nil
}

func TestHealth(t *testing.T) {
	t.Parallel()
	root := copyHost(t, "dgx-h100")
	hc := &checker{started: make(chan []nv.GPU, 1), report: make(chan func(string, bool, string), 1)}
	k := serve(t, root, nvidia.Config{RescanInterval: plugins.Duration{Duration: 100 * time.Millisecond}}, hc)
	k.WaitForDevices(t, res, dptest.Healthy(8))
	dev := filepath.Join(root, "dev")

	if err := os.Remove(filepath.Join(dev, "nvidia3")); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Health(uuid(3), pluginapi.Unhealthy))
	k.WaitForDevices(t, res, dptest.Healthy(7))
	if err := os.WriteFile(filepath.Join(dev, "nvidia3"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Healthy(8))

	// The health checker sees every GPU and can mark one unhealthy.
	select {
	case gpus := <-hc.started:
		if len(gpus) != 8 {
			t.Errorf("checker got %d GPUs", len(gpus))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("health checker not started")
	}
	report := <-hc.report
	report(uuid(6), false, "Xid 79: GPU has fallen off the bus")
	k.WaitForDevices(t, res, dptest.Health(uuid(6), pluginapi.Unhealthy))
	report(uuid(6), true, "")
	k.WaitForDevices(t, res, dptest.Healthy(8))

	// A GPU gone from procfs stays listed, unhealthy, and cannot be allocated.
	if err := os.RemoveAll(filepath.Join(root, "proc/driver/nvidia/gpus/0000:ba:00.0")); err != nil {
		t.Fatal(err)
	}
	devs := k.WaitForDevices(t, res, dptest.Health(uuid(6), pluginapi.Unhealthy))
	if len(devs) != 8 {
		t.Errorf("%d devices, want 8", len(devs))
	}
	if _, err := k.Allocate(context.Background(), res, uuid(6)); err == nil {
		t.Error("allocating a vanished GPU succeeded")
	}
	// Excluded by the driver.
	info := filepath.Join(root, "proc/driver/nvidia/gpus/0000:18:00.0/information")
	b, err := os.ReadFile(info)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(info, []byte(strings.Replace(string(b), "GPU Excluded:\t No", "GPU Excluded:\t Yes", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Health(uuid(0), pluginapi.Unhealthy))
	// Without /dev/nvidiactl no GPU is usable.
	if err := os.Remove(filepath.Join(dev, "nvidiactl")); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, res, dptest.Healthy(0))
}

func TestNoDriver(t *testing.T) {
	t.Parallel()
	k := serve(t, filepath.Join(hosts, "laptop"), nvidia.Config{}, nil)
	k.WaitForDevices(t, res, dptest.Count(0))
}

// describe serves the dgx-h100 fixture with cfg and returns its Describer
// once the GPUs are listed.
func describe(t *testing.T, cfg nvidia.Config, devices int) deviceplugin.Describer {
	t.Helper()
	cfg.Default()
	r, err := nvidia.New(cfg, opts(filepath.Join(hosts, "dgx-h100")))
	if err != nil {
		t.Fatal(err)
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, r...)
	k.WaitForDevices(t, res, dptest.Healthy(devices))
	d, ok := r[0].Plugin.(deviceplugin.Describer)
	if !ok {
		t.Fatalf("%T is not a deviceplugin.Describer", r[0].Plugin)
	}
	return d
}

func TestDescribe(t *testing.T) {
	t.Parallel()
	d := describe(t, nvidia.Config{}, 8)
	info, ok := d.Describe(uuid(5))
	if !ok {
		t.Fatalf("Describe(%s): unknown", uuid(5))
	}
	want := deviceplugin.DeviceInfo{
		PCIBusID: "0000:ab:00.0",
		Attributes: map[string]deviceplugin.Attribute{
			"uuid":          deviceplugin.StringAttr(uuid(5)),
			"productName":   deviceplugin.StringAttr("NVIDIA H100 80GB HBM3"),
			"minor":         deviceplugin.IntAttr(5),
			"driverVersion": deviceplugin.VersionAttr("550.90.7"),
		},
		Capacity: map[string]string{"memory": "80Gi"},
	}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("Describe(%s) =\n%s\nwant\n%s", uuid(5), dump(info), dump(want))
	}
	for _, id := range []string{"GPU-unknown", uuid(5) + "::0"} {
		if _, ok := d.Describe(id); ok {
			t.Errorf("Describe(%s) is known without replicas", id)
		}
	}

	// A time-sliced GPU is shared: each replica is a fixed share of its
	// memory.
	d = describe(t, nvidia.Config{Replicas: 2}, 24) // 8 GPUs and their replicas
	gpu, ok := d.Describe(uuid(5))
	wantShared := map[string]deviceplugin.SharedCapacity{"memory": {Total: 80 << 30, Default: 80 << 30, Min: 1 << 20, Step: 1 << 20}}
	if !ok || gpu.Sharing == nil || !reflect.DeepEqual(gpu.Sharing.Shared, wantShared) {
		t.Errorf("Describe(%s) with replicas = %s, %v; want it shared: %s", uuid(5), dump(gpu), ok, dump(wantShared))
	}
	for _, id := range []string{uuid(5) + "::0", uuid(5) + "::1"} {
		got, ok := d.Describe(id)
		share := &deviceplugin.Sharing{ShareOf: uuid(5), ShareAmounts: map[string]int64{"memory": 40 << 30}}
		if !ok || !reflect.DeepEqual(got.Attributes, want.Attributes) || !reflect.DeepEqual(got.Sharing, share) {
			t.Errorf("Describe(%s) = %s, %v; want the GPU's attributes and a share of 40Gi", id, dump(got), ok)
		}
	}
	if _, ok := d.Describe(uuid(5) + "::2"); ok {
		t.Errorf("Describe(%s) is known with 2 replicas", uuid(5)+"::2")
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestMIGPartitions: with mig: partitions, each H100 of the DGX fixture
// is published with its MIG partitions (NVIDIA's table for the model) and
// a counter set of its slices; through the inventory, seven 1g.10gb
// partitions of a GPU fit and then nothing else of it, the whole GPU is
// refused while they are held, and the device plugin front offers whole
// GPUs only.
func TestMIGPartitions(t *testing.T) {
	t.Parallel()
	cfg := nvidia.Config{MIG: nvidia.MIGPartitions}
	cfg.Default()
	r, err := nvidia.New(cfg, opts(filepath.Join(hosts, "dgx-h100")))
	if err != nil {
		t.Fatal(err)
	}
	inv := invtest.Run(t, res, r[0].Plugin)
	ctx := context.Background()
	devs, sets, _ := inv.DRAView()
	// Per GPU: itself, 7 1g.10gb, 4 1g.20gb, 3 2g.20gb, 2 3g.40gb, 4g.40gb, 7g.80gb.
	if len(devs) != 8*19 || len(sets) != 8 || sets[0].Counters[nvidia.CounterComputeSlices] != 7 || sets[0].Counters[nvidia.CounterMemorySlices] != 8 {
		t.Fatalf("%d devices and sets %s published, want 152 and 8 sets of 7 compute and 8 memory slices", len(devs), dump(sets))
	}
	info, ok := r[0].Plugin.(deviceplugin.Describer).Describe(uuid(0) + "::3g.40gb-1")
	if !ok || *info.Attributes[nvidia.AttrProfile].String != "3g.40gb" || !*info.Attributes[nvidia.AttrPartition].Bool ||
		info.Sharing.Consumes[0].Counters[nvidia.CounterMemorySlices] != 4 {
		t.Errorf("3g.40gb partition: %s", dump(info))
	}
	claim := func(n int) inventory.Holder {
		return inventory.ClaimHolder("ml", fmt.Sprint("c", n), fmt.Sprint("u", n))
	}
	for n := range 7 {
		if err := inv.Acquire([]string{fmt.Sprintf("%s::1g.10gb-%d", uuid(0), n)}, claim(n)); err != nil {
			t.Fatalf("1g.10gb-%d: %v", n, err)
		}
	}
	for _, id := range []string{uuid(0) + "::1g.20gb-0", uuid(0) + "::7g.80gb-0", uuid(0)} {
		if err := inv.Acquire([]string{id}, claim(9)); err == nil || !strings.Contains(err.Error(), "compute-slices") {
			t.Errorf("%s beside seven 1g.10gb: %v, want refused for want of compute slices", id, err)
		}
	}
	front := inv.DevicePluginFront()
	got := make(chan []deviceplugin.Device, 1)
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go func() {
		_ = front.Scan(sctx, func(d []deviceplugin.Device) {
			select {
			case got <- d:
			default:
			}
		})
	}()
	var ids []string
	for _, d := range <-got {
		ids = append(ids, d.ID)
	}
	if len(ids) != 7 || slices.Contains(ids, uuid(0)) || slices.ContainsFunc(ids, func(id string) bool { return strings.Contains(id, "::") }) {
		t.Errorf("device plugin front offers %v, want the 7 whole GPUs not partitioned", ids)
	}
}

// TestMemoryShares: time-slicing replicas on the device plugin front and
// DRA shares of the same GPU's memory, through one inventory, never add up
// to more than the GPU's 80Gi.
func TestMemoryShares(t *testing.T) {
	t.Parallel()
	cfg := nvidia.Config{Replicas: 4, Shared: map[string]plugins.SharePolicy{"memory": {Min: "1Gi", Step: "1Gi"}}}
	cfg.Default()
	r, err := nvidia.New(cfg, opts(filepath.Join(hosts, "dgx-h100")))
	if err != nil {
		t.Fatal(err)
	}
	inv := invtest.Run(t, res, r[0].Plugin)
	ctx := context.Background()
	devs, _, _ := inv.DRAView()
	if len(devs) != 8 || devs[0].Capacity["memory"] != 80<<30 || devs[0].Sharing.Shared["memory"].Step != 1<<30 {
		t.Fatalf("DRA view %s, want the 8 GPUs shared, 80Gi each in 1Gi steps", dump(devs))
	}

	front := inv.DevicePluginFront()
	for _, id := range []string{uuid(0) + "::0", uuid(0) + "::1"} {
		if _, err := front.Allocate(ctx, []string{id}); err != nil {
			t.Fatalf("replica %s: %v", id, err)
		}
	}
	claim := inventory.ClaimHolder("ml", "c", "u")
	err = inv.AcquireGrants([]inventory.Grant{{Device: uuid(0), ShareID: "s1", Amounts: map[string]int64{"memory": 41 << 30}}}, claim)
	if err == nil || !strings.Contains(err.Error(), "memory 41Gi asked, 40Gi of 80Gi left") {
		t.Errorf("a 41Gi share beside two 20Gi replicas: %v, want refused for memory", err)
	}
	if err := inv.AcquireGrants([]inventory.Grant{{Device: uuid(0), ShareID: "s1", Amounts: map[string]int64{"memory": 40 << 30}}}, claim); err != nil {
		t.Fatalf("a 40Gi share beside two 20Gi replicas: %v", err)
	}
	if _, err := front.Allocate(ctx, []string{uuid(0) + "::2"}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a third replica beside 80Gi held: %v, want FailedPrecondition", err)
	}
	if _, err := front.Allocate(ctx, []string{uuid(1) + "::0"}); err != nil {
		t.Errorf("a replica of another GPU: %v", err)
	}
	devs, _, _ = inv.DRAView()
	for _, d := range devs {
		if d.ID == uuid(0) && d.Capacity["memory"] != 40<<30 {
			t.Errorf("published %s with %d of memory, want the 40Gi the replicas leave", d.ID, d.Capacity["memory"])
		}
	}
}
