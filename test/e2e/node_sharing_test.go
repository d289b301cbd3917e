package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/draplugin"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/test/controlplane"
)

// TestVirtualNodeSharing: one 80Gi GPU of the fake plugin, published
// through DRA with seven 1g-10gb partitions and as a shared device, on a
// dpkit node with kube-scheduler and kube-controller-manager. Seven
// partition pods run and an eighth stays Pending; a whole-GPU pod stays
// Pending while any partition is held and runs once they are gone; then
// four pods asking 20Gi each share the GPU, a fifth stays Pending, and
// each container's environment shows its own share.
func TestVirtualNodeSharing(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{Scheduler: true, ControllerManager: true})
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	node := unique("vn-share")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, node, root, func(o *noderun.Options) {
		o.CDISpecDirs = []string{filepath.Join(root, "cdi")}
	})
	res := "e2e.dpkit.io/gpu"
	driver := resourcename.DriverName(res)
	startFakeFronts(t, root, node, cp.Kubeconfig, "dra", fmt.Sprintf(`
    - name: %s
      count: 1
      idPattern: gpu-{index}
      capacity: {memory: 80Gi, slices: 7}
      partitions:
      - {profile: 1g-10gb, count: 7, consumes: {memory: 10Gi, slices: 1}}
      shared:
        memory: {min: 1Gi, step: 1Gi}`, res))
	whole := draplugin.DeviceName("gpu-0")
	poll(t, ctx, "the GPU and its 7 partitions published", func(ctx context.Context) (bool, string, error) {
		names, err := sliceDevices(ctx, c, node, driver)
		return len(names) == 8 && slices.Contains(names, whole), fmt.Sprintf("devices %v", names), err
	})
	checkSharingSlices(t, ctx, c, node, driver)

	class := unique("gpu")
	dc := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)}}},
	}}
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.ResourceV1().DeviceClasses().Delete(context.Background(), class, metav1.DeleteOptions{}) })
	ns := createNamespace(t, c, "vn-share")
	template := func(name, selector string, memory string) {
		req := &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: selector}}}}
		if memory != "" {
			req.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
				resourcev1.QualifiedName(driver + "/memory"): resource.MustParse(memory),
			}}
		}
		tmpl := &resourcev1.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: req}},
			}}},
		}
		if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	attrs := fmt.Sprintf("device.attributes[%q]", driver)
	template("mig", attrs+`.partition && `+attrs+`.profile == "1g-10gb"`, "")
	template("whole", attrs+".partition == false", "")
	template("share", attrs+".partition == false", "20Gi")
	script := `echo share=$DPKIT_SHARE_ID memory=$DPKIT_SHARE_MEMORY; exec sleep 600`
	run := func(name, tmpl string) {
		t.Helper()
		pod := devicePod(ns, name, node, "0", []string{"sh", "-c", script})
		pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		evs, _ := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
		cls, _ := c.ResourceV1().ResourceClaims(ns).List(context.Background(), metav1.ListOptions{})
		for _, cl := range cls.Items {
			t.Logf("claim %s allocation=%v reserved=%v", cl.Name, cl.Status.Allocation, cl.Status.ReservedFor)
		}
		sl, _ := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		for _, s := range sl.Items {
			if s.Spec.Driver == driver {
				t.Logf("slice %s: counters %v devices %v", s.Name, s.Spec.SharedCounters, s.Spec.Devices)
			}
		}
	})
	running := func(name string) {
		t.Helper()
		waitPod(t, ctx, c, ns, name, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	}
	unschedulable := func(name string) {
		t.Helper()
		waitEvent(t, ctx, c, ns, name, "FailedScheduling", "")
		if p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		} else if p.Spec.NodeName != "" {
			t.Fatalf("%s bound to %s, want it unschedulable", name, p.Spec.NodeName)
		}
	}
	deleteAll := func(names ...string) {
		t.Helper()
		for _, n := range names {
			if err := c.CoreV1().Pods(ns).Delete(ctx, n, metav1.DeleteOptions{GracePeriodSeconds: ptr[int64](0)}); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Seven partitions, and no eighth.
	var migs []string
	for i := range 7 {
		migs = append(migs, fmt.Sprintf("mig-%d", i))
		run(migs[i], "mig")
	}
	for _, n := range migs {
		running(n)
	}
	run("mig-7", "mig")
	unschedulable("mig-7")
	// The whole GPU waits while any partition is held...
	run("whole", "whole")
	unschedulable("whole")
	deleteAll("mig-7", "mig-6")
	// An admin-access claim observes the partition mig-0 holds: it is
	// prepared, and mig-0 keeps it. The scheduler charges the counters of
	// an admin-access request too (v1.37), so one partition is freed
	// first.
	nsObj, err := c.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels[resourcev1.DRAAdminNamespaceLabelKey] = "true"
	if _, err := c.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	admin := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "admin"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1, AdminAccess: ptr(true),
				Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("%s.id == %q", attrs, deviceOf(t, ctx, c, ns, "mig-0"))}}},
			}}},
		}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, admin, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run("monitor", "admin")
	running("monitor")
	for _, n := range migs[:6] {
		if p, err := c.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("%s beside the admin-access claim: %v %v, want it Running still", n, p.Status.Phase, err)
		}
	}
	deleteAll("monitor")
	deleteAll(migs[:6]...)
	// ... and runs once they are gone.
	running("whole")
	deleteAll("whole")
	// The shares are asked for once the whole GPU's claim is gone: a pod
	// the scheduler found no room for waits for an event that requeues it.
	poll(t, ctx, "every claim of "+ns+" gone", func(ctx context.Context) (bool, string, error) {
		list, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		return len(list.Items) == 0, fmt.Sprintf("%d claims", len(list.Items)), nil
	})

	// Four 20Gi shares of the 80Gi GPU, and no fifth.
	var shares []string
	for i := range 4 {
		shares = append(shares, fmt.Sprintf("share-%d", i))
		run(shares[i], "share")
	}
	seen := map[string]string{}
	line := regexp.MustCompile(`share=(\S+) memory=(\S+)`)
	for _, n := range shares {
		running(n)
		logs := podLogsWith(t, ctx, c, ns, n, "memory=")
		m := line.FindStringSubmatch(logs)
		if m == nil || m[2] != "20Gi" {
			t.Fatalf("%s's environment: %q, want its share's ID and memory=20Gi", n, logs)
		}
		if other, dup := seen[m[1]]; dup {
			t.Fatalf("%s and %s have the same share %s", n, other, m[1])
		}
		seen[m[1]] = n
	}
	run("share-4", "share")
	unschedulable("share-4")
	// A partition does not fit beside the shares either.
	run("mig-beside-shares", "mig")
	unschedulable("mig-beside-shares")
	// Each share is its own claim, with its own shareID in its allocation.
	claims, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if r.ShareID != nil {
				ids[string(*r.ShareID)] = true
				if q := r.ConsumedCapacity[resourcev1.QualifiedName(driver+"/memory")]; q.String() != "20Gi" {
					t.Errorf("claim %s consumed %s, want 20Gi", cl.Name, q.String())
				}
			}
		}
	}
	for id, pod := range seen {
		if !ids[id] {
			t.Errorf("%s's share %s is not in any claim's allocation (%v)", pod, id, ids)
		}
	}

	deleteAll(shares[0])
	running("share-4")
	deleteAll("mig-beside-shares")

	// A DeviceTaintRule with NoExecute on the GPU: kube-controller-manager
	// evicts the pods whose claims hold it, the node unprepares their
	// claims, and only a claim that tolerates the taint gets the GPU
	// after.
	const taintKey = "example.com/maintenance"
	rule := &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: unique("gpu-maintenance")},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: &driver, Pool: &node, Device: &whole},
			Taint:          resourcev1.DeviceTaint{Key: taintKey, Value: "true", Effect: resourcev1.DeviceTaintEffectNoExecute},
		},
	}
	if _, err := c.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.ResourceV1().DeviceTaintRules().Delete(context.Background(), rule.Name, metav1.DeleteOptions{})
	})
	for _, n := range append(shares[1:], "share-4") {
		poll(t, ctx, n+" evicted for the taint", func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods(ns).Get(ctx, n, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, "gone", nil
			}
			if err != nil {
				return false, "", err
			}
			return false, fmt.Sprintf("phase %s, deleting %v", p.Status.Phase, p.DeletionTimestamp != nil), nil
		})
	}
	tolerant := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tolerant"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{
				DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Selectors:   []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: attrs + ".partition == false"}}},
				Tolerations: []resourcev1.DeviceToleration{{Key: taintKey, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoExecute}},
			}}},
		}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tolerant, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	run("after-taint", "share")
	unschedulable("after-taint")
	run("tolerates", "tolerant")
	running("tolerates")
}

// checkSharingSlices checks the layout the scheduler needs: the counter
// set in a slice of its own, the partitions consuming it, the GPU shared
// with a request policy.
func checkSharingSlices(t *testing.T, ctx context.Context, c kubernetes.Interface, node, driver string) {
	t.Helper()
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var sets, devices int
	for _, s := range list.Items {
		if s.Spec.Driver != driver || s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
			t.Errorf("slice %s has counters and devices; the API wants them apart", s.Name)
		}
		for _, cs := range s.Spec.SharedCounters {
			sets++
			if q := cs.Counters["slices"].Value; q.Value() != 7 {
				t.Errorf("counter set %s: slices %s, want 7", cs.Name, q.String())
			}
		}
		for _, d := range s.Spec.Devices {
			devices++
			if len(d.ConsumesCounters) != 1 {
				t.Errorf("device %s consumes %v, want the GPU's set", d.Name, d.ConsumesCounters)
			}
			if strings.HasPrefix(d.Name, "gpu-0-") {
				continue
			}
			if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
				t.Errorf("the GPU %s is not shared", d.Name)
			}
			if pol := d.Capacity[resourcev1.QualifiedName(driver+"/memory")].RequestPolicy; pol == nil || pol.Default.String() != "80Gi" {
				t.Errorf("the GPU's memory request policy %+v, want default 80Gi (a claim asking nothing takes it whole)", pol)
			}
		}
	}
	if sets != 1 || devices != 8 {
		t.Errorf("%d counter sets and %d devices published, want 1 and 8", sets, devices)
	}
}

// TestVirtualNodeSharedBothFronts: one fake 80Gi GPU served through both
// fronts at once: the device plugin front as four 20Gi replicas, DRA as a
// shared device. Pods asking a replica (the extended resource) or a 20Gi
// share (a claim from a template) are created and deleted by 6 workers;
// after every change the node's PodResources is read, and the replicas
// and shares held at once never add up to more than 80Gi.
func TestVirtualNodeSharedBothFronts(t *testing.T) {
	cp := controlplane.StartForTest(t, controlplane.Options{Scheduler: true, ControllerManager: true})
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	node := unique("vn-shared")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, node, root, nil)
	res := "e2e.dpkit.io/shared"
	driver := resourcename.DriverName(res)
	config := startFakeFronts(t, root, node, cp.Kubeconfig, "deviceplugin, dra", fmt.Sprintf(`
    - name: %s
      count: 1
      idPattern: gpu-{index}
      capacity: {memory: 80Gi}
      shared:
        memory: {min: 1Gi, step: 1Gi}
      replicas: 4`, res))
	poll(t, ctx, "4 replicas allocatable and the GPU published", func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		names, err := sliceDevices(ctx, c, node, driver)
		q := n.Status.Allocatable[corev1.ResourceName(res)]
		return q.Value() == 4 && slices.Equal(names, []string{"gpu-0"}), fmt.Sprintf("allocatable %s, devices %v", q.String(), names), err
	})
	class := applyDeviceClasses(t, ctx, c, "--config", config)[0]
	ns := createNamespace(t, c, "vn-shared")
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "share"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					resourcev1.QualifiedName(driver + "/memory"): resource.MustParse("20Gi"),
				}}},
		}}}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	prc := dialPodResources(t, ctx, root)

	var (
		mu         sync.Mutex
		checks     int
		most       int
		violations []string
	)
	// check counts the 20Gi parts the node says pods hold: replicas
	// through the device plugin front, shares through DRA.
	check := func() {
		resp, err := prc.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			t.Errorf("PodResources List: %v", err)
			return
		}
		var held []string
		for _, p := range resp.GetPodResources() {
			for _, ctr := range p.GetContainers() {
				for _, d := range ctr.GetDevices() {
					if d.GetResourceName() == res {
						for _, id := range d.GetDeviceIds() {
							held = append(held, p.GetName()+" replica "+id)
						}
					}
				}
				for _, dr := range ctr.GetDynamicResources() {
					for _, cr := range dr.GetClaimResources() {
						if cr.GetDriverName() == driver {
							held = append(held, p.GetName()+" share "+cr.GetShareId())
						}
					}
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		checks++
		most = max(most, len(held))
		if len(held) > 4 {
			violations = append(violations, strings.Join(held, ", "))
		}
	}
	total := 100
	if testing.Short() {
		total = 40
	}
	ran, refusals := churnFronts(t, ctx, c, ns, node, res, "share", total, 2, check)
	poll(t, ctx, "the 4 replicas allocatable again", func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		q := n.Status.Allocatable[corev1.ResourceName(res)]
		return q.Value() == 4, "allocatable " + q.String(), nil
	})
	mu.Lock()
	defer mu.Unlock()
	kinds := slices.Sorted(maps.Keys(ran))
	for _, k := range kinds {
		t.Logf("%s: %d pods", k, ran[k])
	}
	t.Logf("%d reads of PodResources; at most %d of the 4 20Gi parts held at once; %d violations; refusals: %v", checks, most, len(violations), refusals)
	for _, v := range violations {
		t.Errorf("more than 80Gi held at once: %s", v)
	}
	if ran["deviceplugin running"] == 0 || ran["dra running"] == 0 {
		t.Errorf("both fronts must have run pods: %v", ran)
	}
}

// deviceOf returns the ID (the id attribute) of the device pod's claim
// was allocated.
func deviceOf(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, pod string) string {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil || len(p.Status.ResourceClaimStatuses) == 0 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("the claim of %s: %v", pod, err)
	}
	cl, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil || cl.Status.Allocation == nil {
		t.Fatalf("the claim of %s: %v", pod, err)
	}
	// The fake's device names are their IDs.
	return cl.Status.Allocation.Devices.Results[0].Device
}

// startFakeFronts writes a plugin config for the dpkit node at root (the
// fake plugin with the resources in the YAML list resources, served
// through fronts) and runs "dpkit plugin" on it; it returns the config's
// path.
func startFakeFronts(t *testing.T, root, node, kubeconfig, fronts, resources string) string {
	t.Helper()
	cfg := fmt.Sprintf(`apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
pluginDir: %[1]s/device-plugins
registryDir: %[1]s/plugins_registry
dra:
  pluginsDir: %[1]s/plugins
  cdiDir: %[1]s/cdi
  nodeName: %[2]s
  kubeconfig: %[3]s
  podResourcesSocket: %[4]s
plugins:
- fake:
    resources:%[5]s
  fronts: [%[6]s]
`, root, node, kubeconfig, podresources.SocketPath(root), resources, fronts)
	config := filepath.Join(root, "plugin.yaml")
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, filepath.Join(root, "plugin.log"), os.Environ(), dpkitBinary(t), "plugin", "--config", config, "--log-level", "debug")
	return config
}
