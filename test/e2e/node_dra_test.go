package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/syncbuf"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/virtualnode"
)

// startDRADriver runs the fake DRA driver (the upstream kubeletplugin
// helper) for node: it registers in root/plugins_registry, publishes a
// ResourceSlice of devices for the node and reads claims from the API
// server. It waits until the slice is there. The pool is named after the
// node, as real drivers do: a pool name is unique per driver in the
// cluster, and two nodes' slices in one pool make it unusable.
func startDRADriver(t *testing.T, ctx context.Context, c kubernetes.Interface, kubeconfig, node, root string, devices ...string) *dratest.Driver {
	t.Helper()
	drv := dratest.Start(t, root, "", "--kubeconfig", kubeconfig, "--node-name", node, "--pool", node, "--devices", strings.Join(devices, ","))
	poll(t, ctx, "the driver's ResourceSlice for "+node, func(ctx context.Context) (bool, string, error) {
		list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
		if err != nil {
			return false, "", err
		}
		var names []string
		for _, s := range list.Items {
			if s.Spec.Driver == dratest.DriverName {
				for _, d := range s.Spec.Devices {
					names = append(names, d.Name)
				}
			}
		}
		slices.Sort(names)
		return slices.Equal(names, devices), fmt.Sprintf("devices %v", names), nil
	})
	return drv
}

// deviceClass creates a DeviceClass selecting the fake driver's devices,
// removed when the test ends.
func deviceClass(t *testing.T, ctx context.Context, c kubernetes.Interface, extendedResource string) string {
	t.Helper()
	dc := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: unique("fake-dra")},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", dratest.DriverName)},
		}}},
	}
	if extendedResource != "" {
		dc.Spec.ExtendedResourceName = &extendedResource
	}
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.ResourceV1().DeviceClasses().Delete(context.Background(), dc.Name, metav1.DeleteOptions{})
	})
	return dc.Name
}

// claimFor returns a ResourceClaim asking for count devices of class
// (request "req").
func claimFor(ns, name, class string, count int64) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name:    "req",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count},
		}}}},
	}
}

// claimPod returns a pod on node whose container "app" uses the claim
// named claim and runs cmd.
func claimPod(ns, name, node, claim string, cmd []string) *corev1.Pod {
	pod := devicePod(ns, name, node, "0", cmd)
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "devices"}}}
	pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "devices", ResourceClaimName: &claim}}
	return pod
}

// TestVirtualNodeDRA is the DRA must-show flow on dpkit node with
// kube-scheduler: the fake DRA driver (the upstream kubeletplugin helper,
// as a process) registers with the node and publishes a ResourceSlice of
// three devices for it; a pod with a ResourceClaim for two devices is
// allocated by the scheduler, its claim prepared by the driver before it
// starts, its logs show the two CDI device IDs, its status the devices'
// health; a claim for four devices leaves its pod unscheduled; and once
// the pod ended the driver is asked to unprepare the claim.
func TestVirtualNodeDRA(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-dra")
	node, _ := startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0", "dev-1", "dev-2")
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "vn-dra")

	claim, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "two", class, 2), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(root, "release")
	script := fmt.Sprintf("echo cdi=$%s; while [ ! -e %s ]; do sleep 0.05; done; echo done", virtualnode.CDIDevicesEnv, release)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "dra", name, "two", []string{"sh", "-c", script}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "dra", "Running on "+name, func(p *corev1.Pod) bool {
		return p.Spec.NodeName == name && p.Status.Phase == corev1.PodRunning
	})
	if m, uids := drv.NextCall(t); m != "NodePrepareResources" || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Fatalf("driver call %s %v, want NodePrepareResources [%s]", m, uids, claim.UID)
	}

	// The scheduler allocated two of the node's devices; the container
	// got their CDI device IDs.
	allocated, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "two", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range allocated.Status.Allocation.Devices.Results {
		want = append(want, dratest.CDIDeviceID(r.Device))
	}
	if len(want) != 2 {
		t.Fatalf("claim allocation %+v, want two devices", allocated.Status.Allocation)
	}
	var logs string
	poll(t, ctx, "the pod's cdi= log line", func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs("dra", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, "cdi="), logs, nil
	})
	m := regexp.MustCompile(`cdi=(\S*)`).FindStringSubmatch(logs)
	if got := strings.Split(m[1], ","); !slices.Equal(got, want) {
		t.Fatalf("logs show CDI devices %q, want %q (the claim's allocation)", m[1], want)
	}

	// The node's metrics count the claim in use.
	if err := testutil.GatherAndCompare(node.Metrics(), strings.NewReader(`
# HELP dra_resource_claims_in_use The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. Instead, use the count for the <any> driver_name.
# TYPE dra_resource_claims_in_use gauge
dra_resource_claims_in_use{driver_name="<any>"} 1
dra_resource_claims_in_use{driver_name="`+dratest.DriverName+`"} 1
`), "dra_resource_claims_in_use"); err != nil {
		t.Fatal(err)
	}

	// The pod's status names the claim's devices with their health.
	poll(t, ctx, "allocatedResourcesStatus claim:devices with both devices Healthy", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "dra", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		var got []string
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, h := range rs.Resources {
					got = append(got, string(rs.Name)+" "+string(h.ResourceID)+" "+string(h.Health))
				}
			}
		}
		slices.Sort(got)
		exp := []string{"claim:devices " + want[0] + " Healthy", "claim:devices " + want[1] + " Healthy"}
		slices.Sort(exp)
		return slices.Equal(got, exp), fmt.Sprintf("%v", got), nil
	})

	// More devices than the node has: never scheduled.
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "four", class, 4), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "too-many", name, "four", []string{"true"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ctx, c, ns, "too-many", "FailedScheduling", "")
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "too-many", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod asking for 4 devices: node %q phase %s, want unbound and Pending", p.Spec.NodeName, p.Status.Phase)
	}

	// Once the pod ended, the driver is asked to unprepare the claim.
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "dra", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [%s]", m, uids, claim.UID)
	}
}

// TestVirtualNodeDRAExtendedResource: a DeviceClass with
// extendedResourceName lets a pod's plain extended-resource request be
// served by DRA (KEP-5004): the scheduler allocates a claim for the pod
// on the node (status.extendedResourceClaimStatus), the node prepares it
// and the container gets its CDI device; the claim is unprepared once
// the pod ended.
func TestVirtualNodeDRAExtendedResource(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-drax")
	const res = corev1.ResourceName("example.com/dra-foo")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0", "dev-1")
	deviceClass(t, ctx, c, string(res))
	ns := createNamespace(t, c, "vn-drax")

	pod := devicePod(ns, "ext", name, "1", []string{"sh", "-c", "echo cdi=$" + virtualnode.CDIDevicesEnv})
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := waitPod(t, ctx, c, ns, "ext", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	s := done.Status.ExtendedResourceClaimStatus
	if s == nil {
		t.Fatal("status.extendedResourceClaimStatus is empty: the scheduler did not serve example.com/dra-foo through DRA")
	}
	claim, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, s.ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	results := claim.Status.Allocation.Devices.Results
	if len(results) != 1 {
		t.Fatalf("claim %s allocation %+v, want one device", claim.Name, claim.Status.Allocation)
	}
	b, err := c.CoreV1().Pods(ns).GetLogs("ext", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "cdi=" + dratest.CDIDeviceID(results[0].Device) + "\n"; string(b) != want {
		t.Fatalf("logs %q, want %q", b, want)
	}
	for _, want := range []string{"NodePrepareResources", "NodeUnprepareResources"} {
		if m, uids := drv.NextCall(t); m != want || !slices.Equal(uids, []string{string(claim.UID)}) {
			t.Fatalf("driver call %s %v, want %s [%s]", m, uids, want, claim.UID)
		}
	}
}

// TestVirtualNodeDRARestart: dpkit node restarted while a pod's claim is
// prepared restores the claim from its checkpoint (dra_manager_state): the
// driver, which registers again, is not asked to prepare it a second
// time, the container keeps running, and the claim is unprepared once the
// pod ended.
func TestVirtualNodeDRARestart(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-drar")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	n, stop := runNode(t, ctx, o)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0", "dev-1")
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "vn-drar")
	claim, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "one", class, 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := filepath.Join(root, "release")
	script := fmt.Sprintf("echo cdi=$%s; while [ ! -e %s ]; do sleep 0.05; done; echo done", virtualnode.CDIDevicesEnv, release)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "dra", name, "one", []string{"sh", "-c", script}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before := waitPod(t, ctx, c, ns, "dra", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if m, _ := drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}

	stop()
	if _, err := os.Stat(filepath.Join(root, "dra_manager_state")); err != nil {
		t.Fatalf("checkpoint after the node stopped: %v", err)
	}
	n2, _ := runNode(t, ctx, o)
	// The driver registers with the new node (its socket is still in
	// plugins_registry).
	for {
		ch := n2.DRAManager().PluginsChanged()
		if ps := n2.DRAManager().Plugins(); len(ps) == 1 && ps[0].Connected {
			break
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("the DRA driver did not register with the restarted node: %v", n2.DRAManager().Plugins())
		}
	}
	if got := n2.DRAManager().Claims(); len(got) != 1 || got[0].ClaimUID != string(claim.UID) {
		t.Fatalf("claims restored after the restart: %+v, want %s", got, claim.UID)
	}
	_ = n

	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := waitPod(t, ctx, c, ns, "dra", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if a, b := before.Status.ContainerStatuses[0].ContainerID, done.Status.ContainerStatuses[0].ContainerID; a != b {
		t.Errorf("container %s after the restart, was %s: it was started again", b, a)
	}
	// The next call is the Unprepare: a second Prepare would come first.
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [%s] (and no second NodePrepareResources)", m, uids, claim.UID)
	}
}

// TestVirtualNodeDRADeleteWaitsForUnprepare: a pod with a prepared claim
// that is deleted stays in the API server, terminated, until its claim is
// unprepared, as the kubelet keeps it until its resources are reclaimed:
// gone sooner, its claim would be deallocated and its devices given to
// another pod while the driver still has them prepared. The driver fails
// Unprepare until healed (the node tries again), then the pod goes.
func TestVirtualNodeDRADeleteWaitsForUnprepare(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-drad")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0")
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "vn-drad")
	claim, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "one", class, 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "dra", name, "one", []string{"sleep", "3600"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, ctx, c, ns, "dra", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if m, _ := drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}
	drv.Send(t, "fail-unprepare device still busy")
	if err := c.CoreV1().Pods(ns).Delete(ctx, "dra", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(1))}); err != nil {
		t.Fatal(err)
	}
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [%s]", m, uids, claim.UID)
	}
	waitPod(t, ctx, c, ns, "dra", "terminated in the API server", func(p *corev1.Pod) bool {
		return p.UID == running.UID && (p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded)
	})
	// The node tries again (every 10s); by then it has long seen the
	// terminal status that would let it finish the deletion.
	drv.DrainCalls()
	if m, _ := drv.NextCall(t); m != "NodeUnprepareResources" {
		t.Fatalf("driver call %s, want NodeUnprepareResources again", m)
	}
	if _, err := c.CoreV1().Pods(ns).Get(ctx, "dra", metav1.GetOptions{}); err != nil {
		t.Fatalf("the pod is gone while its claim is still prepared: %v", err)
	}
	drv.Send(t, "heal")
	if m, _ := drv.NextCall(t); m != "NodeUnprepareResources" {
		t.Fatalf("driver call %s, want NodeUnprepareResources", m)
	}
	poll(t, ctx, "the pod to be gone once its claim is unprepared", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "dra", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, "", err
		}
		return false, fmt.Sprintf("phase %s", p.Status.Phase), nil
	})
}

// TestVirtualNodeDRADriverKilled: the driver of a running pod's claim
// killed, the claim's devices go Unknown in the pod's status; a driver
// back on the node reports them Healthy again.
func TestVirtualNodeDRADriverKilled(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-drak")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0")
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "vn-drak")
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "one", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "dra", name, "one", []string{"sleep", "3600"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	healthIs := func(want corev1.ResourceHealthStatus) {
		t.Helper()
		poll(t, ctx, "the claim's device "+string(want)+" in the pod's status", func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods(ns).Get(ctx, "dra", metav1.GetOptions{})
			if err != nil {
				return false, "", err
			}
			var got []string
			for _, cs := range p.Status.ContainerStatuses {
				for _, rs := range cs.AllocatedResourcesStatus {
					for _, h := range rs.Resources {
						got = append(got, string(rs.Name)+" "+string(h.ResourceID)+" "+string(h.Health))
					}
				}
			}
			return slices.Equal(got, []string{"claim:devices " + dratest.CDIDeviceID("dev-0") + " " + string(want)}), fmt.Sprintf("phase %s health %v", p.Status.Phase, got), nil
		})
	}
	healthIs(corev1.ResourceHealthStatusHealthy)
	drv.Kill()
	healthIs(corev1.ResourceHealthStatusUnknown)
	startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0")
	healthIs(corev1.ResourceHealthStatusHealthy)
}

// nodeSlices returns the names of the devices in the ResourceSlices of
// driver for node.
func nodeSlices(ctx context.Context, c kubernetes.Interface, node, driver string) ([]string, error) {
	sel := fields.Set{resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: driver}
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// staleSlice creates a ResourceSlice of driver for node with one device,
// as a driver of an earlier run of the node left it.
func staleSlice(t *testing.T, ctx context.Context, c kubernetes.Interface, node, driver, device string) {
	t.Helper()
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-stale-"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			NodeName: &node,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourcev1.Device{{Name: device}},
		},
	}
	created, err := c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.ResourceV1().ResourceSlices().Delete(context.Background(), created.Name, metav1.DeleteOptions{})
	})
}

// TestVirtualNodeDRASlicesWiped: the node deletes the ResourceSlices
// its DRA drivers published, as the kubelet does. At start every
// driver's slices for the node go (a driver of an earlier run may never
// come back), and those of other nodes stay; a driver killed on the node
// has its slices deleted once it stayed away for the wiping delay
// (shortened here; 30 s by default), so the scheduler no longer puts
// pods on its devices.
func TestVirtualNodeDRASlicesWiped(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-draw")
	other := unique("vn-draw-other")
	staleSlice(t, ctx, c, name, dratest.DriverName, "stale-0")
	staleSlice(t, ctx, c, name, "other.dpkit.io", "stale-1")
	staleSlice(t, ctx, c, other, dratest.DriverName, "kept-0")

	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, func(o *noderun.Options) { o.DRAWipingDelay = 2 * time.Second })
	for _, driver := range []string{dratest.DriverName, "other.dpkit.io"} {
		poll(t, ctx, "the node's stale ResourceSlices of "+driver+" deleted at start", func(ctx context.Context) (bool, string, error) {
			names, err := nodeSlices(ctx, c, name, driver)
			return len(names) == 0, fmt.Sprintf("devices %v", names), err
		})
	}
	if names, err := nodeSlices(ctx, c, other, dratest.DriverName); err != nil || !slices.Equal(names, []string{"kept-0"}) {
		t.Fatalf("another node's slice: devices %v (%v), want [kept-0] kept", names, err)
	}

	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0", "dev-1")
	drv.Kill()
	poll(t, ctx, "the killed driver's ResourceSlices deleted after the wiping delay", func(ctx context.Context) (bool, string, error) {
		names, err := nodeSlices(ctx, c, name, dratest.DriverName)
		return len(names) == 0, fmt.Sprintf("devices %v", names), err
	})
	if names, err := nodeSlices(ctx, c, other, dratest.DriverName); err != nil || !slices.Equal(names, []string{"kept-0"}) {
		t.Fatalf("another node's slice: devices %v (%v), want [kept-0] kept", names, err)
	}
}

// TestVirtualNodeDRAPrefersDevicePlugin: on a node where a device plugin
// and a DeviceClass (extendedResourceName) both give one extended
// resource, which a node must not do, the node logs a warning naming the
// resource and the DeviceClass, and the scheduler's v1.37 rule holds: the
// node's allocatable for the name is above zero, so a pod asking for it
// gets a device of the plugin's (no extendedResourceClaimStatus, no
// claim, no call to the DRA driver).
func TestVirtualNodeDRAPrefersDevicePlugin(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-drap")
	res := corev1.ResourceName("example.com/" + unique("both"))
	class := deviceClass(t, ctx, c, string(res))

	var logs syncbuf.Buffer
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	nctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := make(chan *virtualnode.Node, 1)
	log := slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, &logs), &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() { done <- noderun.Run(nctx, log, o, func(ns []*virtualnode.Node) { started <- ns[0] }) }()
	afterNodeStops(t, o)
	t.Cleanup(func() { cancel(); <-done })
	var node *virtualnode.Node
	select {
	case node = <-started:
	case err := <-done:
		t.Fatalf("dpkit node exited before it ran: %v", err)
	}
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0")

	config := filepath.Join(t.TempDir(), "plugin.yaml")
	if err := os.WriteFile(config, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: "+string(res)+"\n      count: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	pdone := make(chan error, 1)
	go func() {
		var out, plogs bytes.Buffer
		pdone <- app.Run(pctx, []string{"plugin", "--config", config, "--plugin-dir", filepath.Join(root, "device-plugins")}, strings.NewReader(""), &out, &plogs)
	}()
	t.Cleanup(func() { pcancel(); <-pdone })
	poll(t, ctx, "the node's warning naming "+string(res)+" and DeviceClass "+class, func(context.Context) (bool, string, error) {
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "resource="+string(res)) && strings.Contains(line, "deviceClass="+class) {
				return true, line, nil
			}
		}
		return false, "no such warning", nil
	})
	poll(t, ctx, "2 "+string(res)+" allocatable", func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		a := n.Status.Allocatable[res]
		return a.Value() == 2, fmt.Sprintf("allocatable %v", n.Status.Allocatable), nil
	})

	ns := createNamespace(t, c, "vn-drap")
	pod := devicePod(ns, "both", name, "1", []string{"sleep", "3600"})
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}}
	created, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, ctx, c, ns, "both", "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	var allocated []string
	poll(t, ctx, "the pod admitted with a device of the plugin's", func(context.Context) (bool, string, error) {
		pa := node.DeviceManager().PodAllocation(created.UID)
		if pa == nil {
			return false, "no allocation", nil
		}
		for _, ca := range pa.Containers {
			for _, ra := range ca.Resources {
				if ra.Resource == string(res) {
					allocated = ra.DeviceIDs
				}
			}
		}
		return len(allocated) == 1, fmt.Sprintf("allocation %+v", pa), nil
	})
	if running.Status.ExtendedResourceClaimStatus != nil {
		t.Fatalf("status.extendedResourceClaimStatus %+v: the scheduler served %s through DRA on a node whose allocatable for it is 2", running.Status.ExtendedResourceClaimStatus, res)
	}
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 0 {
		t.Fatalf("claims %v in the namespace, want none", claims.Items)
	}
	if err := c.CoreV1().Pods(ns).Delete(ctx, "both", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	drv.NoMoreCalls(t)
}
