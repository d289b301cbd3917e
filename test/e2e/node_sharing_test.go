package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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
    resources:
    - name: %[5]s
      count: 1
      idPattern: gpu-{index}
      capacity: {memory: 80Gi, slices: 7}
      partitions:
      - {profile: 1g-10gb, count: 7, consumes: {memory: 10Gi, slices: 1}}
      shared:
        memory: {min: 1Gi, step: 1Gi}
  fronts: [dra]
`, root, node, cp.Kubeconfig, podresources.SocketPath(root), res)
	config := filepath.Join(root, "plugin.yaml")
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, filepath.Join(root, "plugin.log"), os.Environ(), dpkitBinary(t), "plugin", "--config", config, "--log-level", "debug")
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
	deleteAll(append(migs, "mig-7")...)
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
