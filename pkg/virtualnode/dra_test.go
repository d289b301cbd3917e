package virtualnode

import (
	"context"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// startDRAProvider runs a device host whose claims come from a directory
// (dratest.Claims), a provider on the sim backend with its DRA loop and
// health watcher, until the test ends.
func startDRAProvider(t *testing.T, root string) (context.Context, dratest.Claims, *provider, *record.FakeRecorder) {
	t.Helper()
	claims := dratest.Claims(filepath.Join(root, "claims"))
	host, err := devicehost.New(devicehost.Config{Root: root, Claims: claims})
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(slog.New(slog.DiscardHandler), host)
	rec := record.NewFakeRecorder(100)
	p.recorder = rec
	p.be = sim.New(sim.Config{Config: backend.Config{Notify: p.backendNotify, ContainerEnv: p.containerEnv}})
	ctx, cancel := context.WithCancel(context.Background())
	if err := host.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	p.draq.loop.Start(ctx, p.runDRA, p.draq.hasWork)
	stopHealth := p.startHealth(ctx, nil)
	t.Cleanup(func() { cancel(); p.draq.loop.Stop(); stopHealth(); host.Stop() })
	return ctx, claims, p, rec
}

func claimHealth(pod *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, cs := range pod.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			for _, h := range rs.Resources {
				v := string(h.Health)
				if h.Message != nil {
					v += ": " + *h.Message
				}
				out[cs.Name+" "+string(rs.Name)+" "+string(h.ResourceID)] = v
			}
		}
	}
	return out
}

// TestPodClaimsPrepared is the node's DRA flow with the fake DRA driver
// (the upstream kubeletplugin helper) as a process: a pod whose claim's
// driver is not registered does not start (Pending, containers waiting
// with the error, a FailedPrepareDynamicResources event naming the
// driver) and starts once the driver registers, its claim prepared in one
// call; the container gets the CDI devices in DPKIT_CDI_DEVICES; the pod
// status shows the devices' health as claim:<name>/<request> and follows
// the driver's reports; and the claim is unprepared once the pod ended.
func TestPodClaimsPrepared(t *testing.T) {
	root := testdir.Short(t, "vnp")
	ctx, claims, p, rec := startDRAProvider(t, root)
	got := recordStatuses(ctx, p)

	const podUID = types.UID("uid-pod")
	claims.Add(t, "ns", "gpu", "uid-gpu", []types.UID{podUID}, "dev-0", "dev-1")
	pod := dratest.Pod("ns", "p", podUID, "gpu")
	pod.Spec.Containers[0].Resources.Claims[0].Request = "req"
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatalf("CreatePod: %v", err)
	}
	waiting := got.wait(t, "p", "Pending, waiting for its claim", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodPending })
	cs := waiting.Status.ContainerStatuses
	if len(cs) != 1 || cs[0].State.Waiting == nil || cs[0].State.Waiting.Reason != "ContainerCreating" ||
		!strings.Contains(cs[0].State.Waiting.Message, "DRA driver "+dratest.DriverName+" is not registered") {
		t.Fatalf("container statuses %+v, want Waiting ContainerCreating with a message naming the driver", cs)
	}
	select {
	case ev := <-rec.Events:
		if want := "Warning " + devicehost.FailedPrepareDynamicResources + " Failed to prepare dynamic resources: prepare dynamic resources: DRA driver " + dratest.DriverName + " is not registered"; !strings.HasPrefix(ev, want) {
			t.Errorf("event %q, want it to start with %q", ev, want)
		}
	default:
		t.Error("no event for the pod whose claims could not be prepared")
	}
	if n := len(p.be.Pods()); n != 0 {
		t.Fatalf("the backend runs %d pods before the claim is prepared, want none", n)
	}

	drv := dratest.Start(t, root, claims)
	if m, uids := drv.NextCall(t); m != "NodePrepareResources" || !reflect.DeepEqual(uids, []string{"uid-gpu"}) {
		t.Fatalf("driver call %s %v, want NodePrepareResources [uid-gpu]", m, uids)
	}
	dev0, dev1 := dratest.CDIDeviceID("dev-0"), dratest.CDIDeviceID("dev-1")
	healthy := map[string]string{"main claim:gpu/req " + dev0: "Healthy", "main claim:gpu/req " + dev1: "Healthy"}
	running := got.wait(t, "p", "Running with both devices Healthy", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && reflect.DeepEqual(claimHealth(p), healthy)
	})
	_ = running

	env, err := p.containerEnv(ctx, pod, "main")
	if err != nil {
		t.Fatal(err)
	}
	want := corev1.EnvVar{Name: CDIDevicesEnv, Value: dev0 + "," + dev1}
	if len(env) != 1 || env[0] != want {
		t.Fatalf("container environment %v, want %v", env, want)
	}

	drv.Send(t, "health dev-1 Unhealthy fan stopped")
	unhealthy := map[string]string{"main claim:gpu/req " + dev0: "Healthy", "main claim:gpu/req " + dev1: "Unhealthy: fan stopped"}
	got.wait(t, "p", "dev-1 Unhealthy with the driver's message", func(p *corev1.Pod) bool {
		return reflect.DeepEqual(claimHealth(p), unhealthy)
	})

	deleting := pod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if err := p.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	got.wait(t, "p", "terminated", func(p *corev1.Pod) bool { return terminal(p) })
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-gpu"}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [uid-gpu]", m, uids)
	}
	drv.NoMoreCalls(t)
}

// TestPodClaimsWaitingDeleted checks that a pod waiting for its claims and
// deleted ends Failed without ever reaching the backend, and that its
// claims are not prepared when the driver registers afterwards.
func TestPodClaimsWaitingDeleted(t *testing.T) {
	root := testdir.Short(t, "vnp")
	ctx, claims, p, _ := startDRAProvider(t, root)
	got := recordStatuses(ctx, p)
	claims.Add(t, "ns", "gpu", "uid-gpu", []types.UID{"uid-pod"}, "dev-0")
	pod := dratest.Pod("ns", "p", "uid-pod", "gpu")
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	got.wait(t, "p", "Pending", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodPending })
	deleting := pod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if err := p.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	got.wait(t, "p", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	drv := dratest.Start(t, root, claims)
	// The driver's registration wakes the DRA loop; a pod it still held
	// would be prepared now.
	for {
		ch := p.host.DRA.PluginsChanged()
		if ps := p.host.DRA.Plugins(); len(ps) == 1 && ps[0].Connected {
			break
		}
		<-ch
	}
	if n := len(p.be.Pods()); n != 0 {
		t.Fatalf("the backend got %d pods, want none", n)
	}
	drv.NoMoreCalls(t)
}

// cdiPlugin has one device and answers Allocate with a CDI device per ID.
type cdiPlugin struct{}

func (cdiPlugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	notify([]deviceplugin.Device{{ID: "d0", Healthy: true}})
	<-ctx.Done()
	return nil
}

func (cdiPlugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{}
	for _, id := range ids {
		resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: "example.com/foo=" + id})
	}
	return resp, nil
}

// TestContainerDevicesCDIOrder: a container with a claim and a device
// plugin's device gets the claim's CDI devices first, then the device
// plugin's, as the kubelet's containerManagerImpl.GetResources merges them.
func TestContainerDevicesCDIOrder(t *testing.T) {
	root := testdir.Short(t, "vnp")
	ctx, claims, p, _ := startDRAProvider(t, root)
	got := recordStatuses(ctx, p)
	changes, unsubscribe := p.host.Manager.Subscribe()
	defer unsubscribe()
	servePlugins(t, root, deviceplugin.Resource{Name: "example.com/foo", Plugin: cdiPlugin{}})
	for {
		if _, alloc := p.host.Manager.Capacity(); alloc["example.com/foo"] == 1 {
			break
		}
		select {
		case <-changes:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	drv := dratest.Start(t, root, claims)
	const podUID = types.UID("uid-both")
	claims.Add(t, "ns", "gpu", "uid-gpu", []types.UID{podUID}, "dev-0")
	pod := dratest.Pod("ns", "both", podUID, "gpu")
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"example.com/foo": resource.MustParse("1")}
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatalf("CreatePod: %v", err)
	}
	if m, _ := drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}
	got.wait(t, "both", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	cd, err := p.containerDevices(ctx, pod, "main")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{dratest.CDIDeviceID("dev-0"), "example.com/foo=d0"}; cd == nil || !reflect.DeepEqual(cd.CDIDevices, want) {
		t.Errorf("container devices %+v, want CDI devices %v: the claim's first, then the device plugin's", cd, want)
	}
}
