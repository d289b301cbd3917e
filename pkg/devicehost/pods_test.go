package devicehost_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
)

// richDevices is a device plugin of two devices whose Allocate answers
// with every kind of runtime option, CDI devices among them.
type richDevices struct{}

func (richDevices) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	notify([]deviceplugin.Device{{ID: "d0", Healthy: true}, {ID: "d1", Healthy: true}})
	<-ctx.Done()
	return nil
}

func (richDevices) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"FOO_DEVICES": strings.Join(ids, ",")},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/opt/foo", HostPath: "/var/lib/foo", ReadOnly: true}},
		Annotations: map[string]string{"example.com/foo": strings.Join(ids, ",")},
	}
	for _, id := range ids {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/foo-" + id, HostPath: "/dev/foo-" + id, Permissions: "rw"})
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: "example.com/foo=" + id})
	}
	return resp, nil
}

// admitHost is a started host on a short root, with claims read from the
// fake DRA driver's claim files and the fake driver registered with it;
// startAdmitHost adds richDevices serving example.com/foo.
type admitHost struct {
	root   string
	host   *devicehost.Host
	claims dratest.Claims
	drv    *dratest.Driver
}

// startDRAHost starts a host and the fake DRA driver, and waits until the
// driver has registered through the host's plugin watcher. Both stop when
// the test ends.
func startDRAHost(t *testing.T) *admitHost {
	t.Helper()
	root := testdir.Short(t, "dh")
	claims := dratest.Claims(filepath.Join(root, "claims"))
	host, err := devicehost.New(devicehost.Config{Root: root, Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := host.Start(ctx, nil); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); host.Stop() })

	drv := dratest.Start(t, root, claims)
	for {
		ch := host.DRA.PluginsChanged()
		if ps := host.DRA.Plugins(); len(ps) == 1 && ps[0].Connected {
			break
		}
		<-ch
	}
	return &admitHost{root: root, host: host, claims: claims, drv: drv}
}

// startAdmitHost is startDRAHost with richDevices registered as
// example.com/foo, once its two devices are allocatable.
func startAdmitHost(t *testing.T) *admitHost {
	t.Helper()
	h := startDRAHost(t)
	srv, err := deviceplugin.NewServer(deviceplugin.Config{
		PluginDir:    filepath.Join(h.root, "device-plugins"),
		Registration: deviceplugin.RegistrationRegistry,
		RegistryDir:  filepath.Join(h.root, "plugins_registry"),
		InstanceID:   "t",
	}, deviceplugin.Resource{Name: "example.com/foo", Plugin: richDevices{}})
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(context.Background())
	pdone := make(chan error, 1)
	go func() { pdone <- srv.Run(pctx) }()
	t.Cleanup(func() {
		pcancel()
		if err := <-pdone; err != nil {
			t.Error(err)
		}
	})
	waitAllocatableFoo(t, h.host, 2)
	return h
}

// waitAllocatableFoo waits until example.com/foo has n allocatable
// devices.
func waitAllocatableFoo(t *testing.T, host *devicehost.Host, n int64) {
	t.Helper()
	ch, unsub := host.Manager.Subscribe()
	defer unsub()
	timeout := time.After(20 * time.Second)
	for {
		if _, a := host.Manager.Capacity(); a["example.com/foo"] == n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("example.com/foo never had %d allocatable devices: %+v", n, host.Manager.Resources())
		}
	}
}

// fooPod is a pod whose container main uses the claim gpu and one
// example.com/foo device, in the host's pod store: a pod is there while it
// is admitted, or the DRA manager's reconcile loop may unprepare its
// claims under it.
func (h *admitHost) fooPod(uid types.UID) *corev1.Pod {
	pod := dratest.Pod("default", "p-"+string(uid), uid, "gpu")
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"example.com/foo": resource.MustParse("1")}
	h.host.Pods.Add(pod)
	return pod
}

// TestContainerResourcesOrder: a container with a claim and a device
// plugin's device gets, as the kubelet's container manager merges them
// (GetResources), the claim's CDI devices first, then the device plugin's,
// and the device plugin's environment, mounts, device nodes and
// annotations.
func TestContainerResourcesOrder(t *testing.T) {
	h := startAdmitHost(t)
	ctx := context.Background()
	h.claims.Add(t, "default", "gpu", "uid-gpu", []types.UID{"pod-1"}, "dev-0", "dev-1")
	pod := h.fooPod("pod-1")
	if err := h.host.AdmitPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := h.drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}
	got, err := h.host.ContainerResources(pod, "main")
	if err != nil {
		t.Fatal(err)
	}
	ids := h.host.Manager.PodAllocation(pod.UID).Containers[0].Resources[0].DeviceIDs
	if len(ids) != 1 {
		t.Fatalf("main holds devices %v, want one", ids)
	}
	id := ids[0]
	want := &devicehost.RunOptions{
		Envs:        []devicehost.KeyValue{{Name: "FOO_DEVICES", Value: id}},
		Mounts:      []devicehost.Mount{{ContainerPath: "/opt/foo", HostPath: "/var/lib/foo", ReadOnly: true}},
		Devices:     []devicehost.DeviceSpec{{ContainerPath: "/dev/foo-" + id, HostPath: "/dev/foo-" + id, Permissions: "rw"}},
		Annotations: []devicehost.KeyValue{{Name: "example.com/foo", Value: id}},
		CDIDevices:  []string{dratest.CDIDeviceID("dev-0"), dratest.CDIDeviceID("dev-1"), "example.com/foo=" + id},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ContainerResources(main) =\n%+v\nwant\n%+v", got, want)
	}
	if o, err := h.host.ContainerResources(pod, "none"); o != nil || err != nil {
		t.Errorf("ContainerResources of a container the pod lacks = %+v, %v; want nil", o, err)
	}
}

// TestAdmitPodRollsBack: a pod whose claim cannot be prepared (it is
// reserved for another pod) is refused with a PrepareError, and the
// device the device manager allocated it is free again.
func TestAdmitPodRollsBack(t *testing.T) {
	h := startAdmitHost(t)
	h.claims.Add(t, "default", "gpu", "uid-gpu", []types.UID{"another"}, "dev-0")
	pod := h.fooPod("pod-1")
	err := h.host.AdmitPod(context.Background(), pod)
	var pe *devicehost.PrepareError
	if !errors.As(err, &pe) || !errors.Is(err, devicehost.ErrNotReserved) || pe.Rollback != nil {
		t.Fatalf("AdmitPod = %v, want a PrepareError wrapping ErrNotReserved, rolled back", err)
	}
	if a := h.host.Manager.PodAllocation(pod.UID); a != nil {
		t.Errorf("the refused pod still holds %+v", a)
	}
	if _, a := h.host.Manager.Capacity(); a["example.com/foo"] != 2 {
		t.Errorf("allocatable example.com/foo = %d after the refusal, want 2", a["example.com/foo"])
	}
	if _, inUse := inUse(h.host); inUse != 0 {
		t.Errorf("example.com/foo in use after the refusal: %d", inUse)
	}
	h.drv.NoMoreCalls(t)
}

// TestReleasePod: removing an admitted pod unprepares its claim through
// the driver and frees its device.
func TestReleasePod(t *testing.T) {
	h := startAdmitHost(t)
	ctx := context.Background()
	h.claims.Add(t, "default", "gpu", "uid-gpu", []types.UID{"pod-1"}, "dev-0")
	pod := h.fooPod("pod-1")
	if err := h.host.AdmitPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := h.drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}
	if _, n := inUse(h.host); n != 1 {
		t.Fatalf("example.com/foo in use after admission: %d, want 1", n)
	}
	if err := h.host.ReleasePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if m, uids := h.drv.NextCall(t); m != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-gpu"}) {
		t.Errorf("driver call %s %v, want NodeUnprepareResources [uid-gpu]", m, uids)
	}
	if h.host.DRA.PodMightNeedToUnprepareResources(pod.UID) {
		t.Error("the released pod still references its claim")
	}
	if a := h.host.Manager.PodAllocation(pod.UID); a != nil {
		t.Errorf("the released pod still holds %+v", a)
	}
	if _, n := inUse(h.host); n != 0 {
		t.Errorf("example.com/foo in use after release: %d", n)
	}
}

// inUse returns example.com/foo's status and how many of its devices are
// in use.
func inUse(host *devicehost.Host) (devicehost.ResourceStatus, int64) {
	for _, r := range host.Manager.Resources() {
		if r.Name == "example.com/foo" {
			return r, r.InUse
		}
	}
	return devicehost.ResourceStatus{}, 0
}
