package generic_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/generic"
)

const hosts = "../../discovery/testdata/hosts"

// copyHost copies a fixture host into a temporary directory so a test can
// change it (symlinks are kept).
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

func newResources(t *testing.T, cfg generic.Config, o plugins.Options) []deviceplugin.Resource {
	t.Helper()
	cfg.Default()
	res, err := generic.New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func ids(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.ID)
	}
	slices.Sort(out)
	return out
}

func TestValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  generic.Config
		want []string // field paths with errors
	}{
		{"ok", generic.Config{Groups: []generic.Group{{Name: "serial", Paths: []generic.PathSpec{{Path: "/dev/ttyUSB*"}}}}}, nil},
		{"no groups", generic.Config{}, []string{"generic.groups"}},
		{"everything wrong", generic.Config{
			RescanInterval: plugins.Duration{Duration: time.Millisecond},
			CDI:            generic.CDIConfig{Enabled: true, SpecDir: "cdi"},
			Groups: []generic.Group{
				{Name: "Bad Name!", Count: -1, Permissions: "rwx",
					Paths:  []generic.PathSpec{{Path: "/etc/passwd"}, {Path: "/dev/tty*", ContainerPath: "/dev/x"}},
					USB:    []generic.USBSpec{{Vendor: "xyz", Product: "12345"}},
					PCI:    []generic.PCISpec{{}, {Vendor: "10de", Class: "zz"}},
					Mounts: []generic.Mount{{HostPath: "rel", ContainerPath: "rel"}},
					Env:    map[string]string{"1BAD": "x"}},
				{Name: "empty"},
				{Name: "dpkit.io/empty", Paths: []generic.PathSpec{{Path: "/dev/fuse"}}},
			}},
			[]string{
				"generic.rescanInterval", "generic.cdi.specDir",
				"generic.groups[0].name", "generic.groups[0].count", "generic.groups[0].permissions",
				"generic.groups[0].paths[0].path", "generic.groups[0].paths[1].containerPath",
				"generic.groups[0].usb[0].vendor", "generic.groups[0].usb[0].product",
				"generic.groups[0].pci[0]", "generic.groups[0].pci[1].class",
				"generic.groups[0].mounts[0].hostPath", "generic.groups[0].mounts[0].containerPath",
				"generic.groups[0].env[1BAD]", "generic.groups[1]", "generic.groups[2].name",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			if cfg.RescanInterval.Duration == 0 {
				cfg.Default()
			} else {
				ri := cfg.RescanInterval
				cfg.Default()
				cfg.RescanInterval = ri
			}
			errs := cfg.Validate(field.NewPath("generic"))
			var got []string
			for _, e := range errs {
				got = append(got, e.Field)
				if e.Detail == "" && e.Type != field.ErrorTypeDuplicate && e.Type != field.ErrorTypeForbidden {
					t.Errorf("%s: no hint how to fix it", e.Field)
				}
			}
			slices.Sort(got)
			want := slices.Clone(tt.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("errors at\n%v\nwant\n%v\n(%v)", got, want, errs)
			}
		})
	}
}

// TestLaptop drives discovery, preferred allocation and Allocate through
// the SDK against the laptop fixture.
func TestLaptop(t *testing.T) {
	t.Parallel()
	o := opts(filepath.Join(hosts, "laptop"))
	cfg := generic.Config{Groups: []generic.Group{
		{Name: "serial", Paths: []generic.PathSpec{{Path: "/dev/ttyUSB*"}, {Path: "/dev/ttyACM*"}}},
		{Name: "example.com/ftdi", USB: []generic.USBSpec{{Vendor: "0403", Product: "6001", Serial: "A50285BI"}}},
		{Name: "example.com/arduino", USB: []generic.USBSpec{{Vendor: "2341"}}, Permissions: "rwm"},
		{Name: "fuse", Paths: []generic.PathSpec{{Path: "/dev/fuse"}}, Count: 3,
			Mounts: []generic.Mount{{HostPath: "/etc/fuse.conf", ReadOnly: true}}, Env: map[string]string{"FUSE": "1"}},
		{Name: "tun", Paths: []generic.PathSpec{{Path: "/dev/net/tun", ContainerPath: "/dev/tun0"}}},
		{Name: "missing", Paths: []generic.PathSpec{{Path: "/dev/nbd0"}}},
		{Name: "igpu", PCI: []generic.PCISpec{{Vendor: "8086", Class: "03"}}},
	}}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, newResources(t, cfg, o)...)
	ctx := context.Background()

	tests := []struct {
		resource string
		healthy  int
		ids      []string
		alloc    []string
		nodes    []string // host paths
	}{
		{"dpkit.io/serial", 3, []string{"ttyACM0", "ttyUSB0", "ttyUSB1"}, []string{"ttyUSB1"}, []string{"/dev/ttyUSB1"}},
		{"example.com/ftdi", 1, []string{"usb-1-2"}, []string{"usb-1-2"}, []string{"/dev/bus/usb/001/004", "/dev/ttyUSB0"}},
		{"example.com/arduino", 1, []string{"usb-3-1"}, []string{"usb-3-1"}, []string{"/dev/bus/usb/003/002", "/dev/ttyACM0"}},
		{"dpkit.io/fuse", 3, []string{"fuse-0", "fuse-1", "fuse-2"}, []string{"fuse-0", "fuse-2"}, []string{"/dev/fuse"}},
		{"dpkit.io/tun", 1, []string{"net_tun"}, []string{"net_tun"}, []string{"/dev/net/tun"}},
		{"dpkit.io/missing", 0, []string{"nbd0"}, nil, nil},
		{"dpkit.io/igpu", 1, []string{"pci-0000:00:02.0"}, []string{"pci-0000:00:02.0"}, []string{"/dev/dri/card0", "/dev/dri/renderD128"}},
	}
	for _, tt := range tests {
		devs := k.WaitForDevices(t, tt.resource, dptest.Count(len(tt.ids)))
		if got := ids(devs); !slices.Equal(got, tt.ids) {
			t.Errorf("%s: IDs %v, want %v", tt.resource, got, tt.ids)
		}
		k.WaitForDevices(t, tt.resource, dptest.Healthy(tt.healthy))
		if tt.alloc == nil {
			continue
		}
		resp, err := k.Allocate(ctx, tt.resource, tt.alloc...)
		if err != nil {
			t.Errorf("%s: Allocate: %v", tt.resource, err)
			continue
		}
		var got []string
		for _, d := range resp.Devices {
			got = append(got, d.HostPath)
		}
		if !slices.Equal(got, tt.nodes) {
			t.Errorf("%s: nodes %v, want %v", tt.resource, got, tt.nodes)
		}
	}

	resp, err := k.Allocate(ctx, "dpkit.io/fuse", "fuse-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Mounts) != 1 || resp.Mounts[0].ContainerPath != "/etc/fuse.conf" || !resp.Mounts[0].ReadOnly || resp.Envs["FUSE"] != "1" || resp.Devices[0].Permissions != "rw" {
		t.Errorf("fuse allocation = %v", resp)
	}
	resp, err = k.Allocate(ctx, "dpkit.io/tun", "net_tun")
	if err != nil || resp.Devices[0].ContainerPath != "/dev/tun0" {
		t.Errorf("tun allocation = %v, %v", resp, err)
	}
	resp, err = k.Allocate(ctx, "example.com/arduino", "usb-3-1")
	if err != nil || resp.Devices[0].Permissions != "rwm" {
		t.Errorf("arduino allocation = %v, %v", resp, err)
	}
	if _, err := k.Allocate(ctx, "dpkit.io/missing", "nbd0"); err == nil {
		t.Error("allocating a device whose node is missing succeeded")
	}
	// Shares spread over devices.
	pref, err := k.Client(t, "dpkit.io/serial").GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: []string{"ttyUSB1", "ttyUSB0", "ttyACM0"}, AllocationSize: 2}},
	})
	if err != nil || !slices.Equal(pref.ContainerResponses[0].DeviceIDs, []string{"ttyACM0", "ttyUSB0"}) {
		t.Errorf("preferred = %v, %v", pref, err)
	}
}

// TestHotplugAndHealth: nodes appear and disappear and the registered
// stream sees it; a USB device whose node vanishes turns unhealthy.
func TestHotplugAndHealth(t *testing.T) {
	t.Parallel()
	root := copyHost(t, "laptop")
	o := opts(root)
	cfg := generic.Config{
		RescanInterval: plugins.Duration{Duration: time.Hour}, // only fsnotify may find the changes
		Groups: []generic.Group{
			{Name: "serial", Paths: []generic.PathSpec{{Path: "/dev/ttyUSB*"}}},
			{Name: "ftdi", USB: []generic.USBSpec{{Vendor: "0403"}}},
			{Name: "render", Paths: []generic.PathSpec{{Path: "/dev/dri/renderD*"}}},
			{Name: "kvm", Paths: []generic.PathSpec{{Path: "/dev/kvm"}}},
		},
	}
	k := dptest.NewKubelet(t)
	k.Timeout = 2 * time.Second // hot-plug must show within a second or so
	dptest.Serve(t, k, newResources(t, cfg, o)...)
	k.WaitForDevices(t, "dpkit.io/serial", dptest.Healthy(2))
	k.WaitForDevices(t, "dpkit.io/ftdi", dptest.Healthy(1))
	k.WaitForDevices(t, "dpkit.io/render", dptest.Healthy(1))
	k.WaitForDevices(t, "dpkit.io/kvm", dptest.Healthy(1))

	dev := filepath.Join(root, "dev")
	touch := func(p string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dev, p), nil, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	rm := func(p string) {
		t.Helper()
		if err := os.Remove(filepath.Join(dev, p)); err != nil {
			t.Fatal(err)
		}
	}
	touch("ttyUSB2")
	devs := k.WaitForDevices(t, "dpkit.io/serial", dptest.Count(3))
	if !slices.Equal(ids(devs), []string{"ttyUSB0", "ttyUSB1", "ttyUSB2"}) {
		t.Errorf("after plug: %v", ids(devs))
	}
	rm("ttyUSB1")
	devs = k.WaitForDevices(t, "dpkit.io/serial", dptest.Count(2))
	if !slices.Equal(ids(devs), []string{"ttyUSB0", "ttyUSB2"}) {
		t.Errorf("after unplug: %v", ids(devs))
	}
	rm("bus/usb/001/004")
	k.WaitForDevices(t, "dpkit.io/ftdi", dptest.Health("usb-1-2", pluginapi.Unhealthy))
	touch("bus/usb/001/004")
	k.WaitForDevices(t, "dpkit.io/ftdi", dptest.Health("usb-1-2", pluginapi.Healthy))
	rm("kvm")
	k.WaitForDevices(t, "dpkit.io/kvm", dptest.Health("kvm", pluginapi.Unhealthy))
	// A directory created after the start is watched too.
	if err := os.RemoveAll(filepath.Join(dev, "dri")); err != nil {
		t.Fatal(err)
	}
	k.WaitForDevices(t, "dpkit.io/render", dptest.Count(0))
	if err := os.Mkdir(filepath.Join(dev, "dri"), 0o755); err != nil {
		t.Fatal(err)
	}
	touch("dri/renderD129")
	devs = k.WaitForDevices(t, "dpkit.io/render", dptest.Healthy(1))
	if devs[0].ID != "dri_renderD129" {
		t.Errorf("render devices %v", ids(devs))
	}
}

func TestVFIOAndNUMA(t *testing.T) {
	t.Parallel()
	o := opts(filepath.Join(hosts, "dgx-h100"))
	cfg := generic.Config{Groups: []generic.Group{{Name: "example.com/cx7", PCI: []generic.PCISpec{{Vendor: "15b3", Device: "1021"}}}}}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, newResources(t, cfg, o)...)
	// Only the two NICs bound to vfio-pci have nodes to hand out.
	devs := k.WaitForDevices(t, "example.com/cx7", dptest.Healthy(2))
	for _, d := range devs {
		if d.Topology == nil || len(d.Topology.Nodes) != 1 || d.Topology.Nodes[0].ID != 1 {
			t.Errorf("%s topology %v, want NUMA node 1", d.ID, d.Topology)
		}
	}
	resp, err := k.Allocate(context.Background(), "example.com/cx7", "pci-0000:bb:00.0", "pci-0000:dc:00.0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range resp.Devices {
		got = append(got, d.HostPath)
	}
	if want := []string{"/dev/vfio/vfio", "/dev/vfio/40", "/dev/vfio/41"}; !slices.Equal(got, want) {
		t.Errorf("VFIO nodes %v, want %v (the container node once)", got, want)
	}
}

func TestCDI(t *testing.T) {
	t.Parallel()
	specDir := filepath.Join(t.TempDir(), "cdi")
	o := opts(filepath.Join(hosts, "laptop"))
	cfg := generic.Config{
		CDI: generic.CDIConfig{Enabled: true, SpecDir: specDir},
		Groups: []generic.Group{{Name: "example.com/serial", Paths: []generic.PathSpec{{Path: "/dev/ttyUSB*"}},
			Mounts: []generic.Mount{{HostPath: "/opt/tools", ReadOnly: true}}, Env: map[string]string{"A": "b"}}},
	}
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, newResources(t, cfg, o)...)
	k.WaitForDevices(t, "example.com/serial", dptest.Healthy(2))
	resp, err := k.Allocate(context.Background(), "example.com/serial", "ttyUSB0")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CdiDevices) != 1 || resp.CdiDevices[0].Name != "example.com/serial=ttyUSB0" || len(resp.Devices) != 0 || len(resp.Mounts) != 0 {
		t.Fatalf("CDI allocation = %v", resp)
	}
	b, err := os.ReadFile(filepath.Join(specDir, plugins.CDISpecFile("example.com/serial")))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	if err := cdispec.ValidateVersion(&spec); err != nil {
		t.Errorf("spec version: %v", err)
	}
	if spec.Kind != "example.com/serial" || len(spec.Devices) != 2 || spec.Devices[0].Name != "ttyUSB0" ||
		spec.Devices[0].ContainerEdits.DeviceNodes[0].HostPath != "/dev/ttyUSB0" ||
		len(spec.ContainerEdits.Mounts) != 1 || !slices.Contains(spec.ContainerEdits.Mounts[0].Options, "ro") ||
		!slices.Equal(spec.ContainerEdits.Env, []string{"A=b"}) {
		t.Errorf("spec = %s", b)
	}
	if strings.Contains(string(b), "tmp") {
		t.Errorf("spec mentions the fixture path: %s", b)
	}
}

// TestDescribe: every kind of device is described from what discovery
// read, every share of a shared device as the device.
func TestDescribe(t *testing.T) {
	t.Parallel()
	o := opts(filepath.Join(hosts, "laptop"))
	cfg := generic.Config{Groups: []generic.Group{
		{Name: "serial", Paths: []generic.PathSpec{{Path: "/dev/ttyUSB*"}}},
		{Name: "example.com/ftdi", USB: []generic.USBSpec{{Vendor: "0403"}}},
		{Name: "fuse", Paths: []generic.PathSpec{{Path: "/dev/fuse"}}, Count: 2},
		{Name: "igpu", PCI: []generic.PCISpec{{Vendor: "8086", Class: "03"}}, Count: 2},
	}}
	res := newResources(t, cfg, o)
	k := dptest.NewKubelet(t)
	dptest.Serve(t, k, res...)
	describers := make(map[string]deviceplugin.Describer)
	for _, r := range res {
		d, ok := r.Plugin.(deviceplugin.Describer)
		if !ok {
			t.Fatalf("%T is not a deviceplugin.Describer", r.Plugin)
		}
		describers[r.Name] = d
	}
	str := deviceplugin.StringAttr
	for _, tt := range []struct {
		resource string
		devices  int
		ids      []string
		want     deviceplugin.DeviceInfo
	}{
		{"dpkit.io/serial", 2, []string{"ttyUSB1"}, deviceplugin.DeviceInfo{Attributes: map[string]deviceplugin.Attribute{"path": str("/dev/ttyUSB1")}}},
		{"example.com/ftdi", 1, []string{"usb-1-2"}, deviceplugin.DeviceInfo{Attributes: map[string]deviceplugin.Attribute{
			"vendorID": str("0403"), "productID": str("6001"), "serial": str("A50285BI"),
		}}},
		{"dpkit.io/fuse", 2, []string{"fuse-0", "fuse-1"}, deviceplugin.DeviceInfo{Attributes: map[string]deviceplugin.Attribute{"path": str("/dev/fuse")}}},
		{"dpkit.io/igpu", 2, []string{"pci-0000:00:02.0-0", "pci-0000:00:02.0-1"}, deviceplugin.DeviceInfo{
			PCIBusID:   "0000:00:02.0",
			Attributes: map[string]deviceplugin.Attribute{"vendorID": str("8086"), "deviceID": str("a7a0"), "class": str("030000")},
		}},
	} {
		k.WaitForDevices(t, tt.resource, dptest.Count(tt.devices))
		for _, id := range tt.ids {
			got, ok := describers[tt.resource].Describe(id)
			if !ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s: Describe(%s) = %s, %v; want %s", tt.resource, id, dump(got), ok, dump(tt.want))
			}
		}
	}
	for _, id := range []string{"fuse", "fuse-2", "nbd0"} {
		if _, ok := describers["dpkit.io/fuse"].Describe(id); ok {
			t.Errorf("Describe(%s) is known", id)
		}
	}
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
