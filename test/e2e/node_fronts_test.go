package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/draplugin"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// bothFronts is a fake plugin serving one resource through the device
// plugin API and DRA at once, run by the dpkit binary (which hands the
// config over to dpkit-cluster) for a dpkit node.
type bothFronts struct {
	resource, driver string
	devices          []string
	config           string
}

// startBothFronts writes the plugin config for node (root: the node's
// root) and runs "dpkit plugin" on it; it waits until the node has the
// devices as allocatable and a ResourceSlice lists them.
func startBothFronts(t *testing.T, ctx context.Context, c kubernetes.Interface, kubeconfig, node, root string, count int) *bothFronts {
	t.Helper()
	res := "e2e.dpkit.io/" + node
	f := &bothFronts{resource: res, driver: resourcename.DriverName(res), config: filepath.Join(root, "plugin.yaml")}
	for i := range count {
		f.devices = append(f.devices, fmt.Sprintf("dev-%d", i))
	}
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
      count: %[6]d
  fronts: [deviceplugin, dra]
`, root, node, kubeconfig, podresources.SocketPath(root), res, count)
	if err := os.WriteFile(f.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	startProc(t, filepath.Join(root, "plugin.log"), os.Environ(), dpkitBinary(t), "plugin", "--config", f.config, "--log-level", "debug")
	poll(t, ctx, "node "+node+" allocatable "+res, func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		q := n.Status.Allocatable[corev1.ResourceName(res)]
		return q.Value() == int64(count), "allocatable " + q.String(), nil
	})
	poll(t, ctx, "the DRA front's ResourceSlice for "+node, func(ctx context.Context) (bool, string, error) {
		names, err := sliceDevices(ctx, c, node, f.driver)
		slices.Sort(names)
		return slices.Equal(names, f.devices), fmt.Sprintf("devices %v", names), err
	})
	return f
}

// sliceDevices lists the devices driver publishes for node.
func sliceDevices(ctx context.Context, c kubernetes.Interface, node, driver string) ([]string, error) {
	list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", node).String()})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range list.Items {
		if s.Spec.Driver == driver {
			for _, d := range s.Spec.Devices {
				names = append(names, d.Name)
			}
		}
	}
	return names, nil
}

// applyDeviceClasses runs "dpkit deviceclass" with args and creates what it
// prints on the API server, removed when the test ends; it returns the
// classes' names.
func applyDeviceClasses(t *testing.T, ctx context.Context, c kubernetes.Interface, args ...string) []string {
	t.Helper()
	out, err := exec.Command(dpkitBinary(t), append([]string{"deviceclass"}, args...)...).Output()
	if err != nil {
		t.Fatalf("dpkit deviceclass %v: %v", args, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(string(out)), 4096)
	var names []string
	var classes []resourcev1.DeviceClass
	for {
		// A YAML document is a DeviceClass; -o json prints a List.
		var doc struct {
			resourcev1.DeviceClass `json:",inline"`
			Items                  []resourcev1.DeviceClass `json:"items"`
		}
		if err := dec.Decode(&doc); err != nil {
			break
		}
		if doc.Kind == "List" {
			classes = append(classes, doc.Items...)
		} else if doc.Name != "" {
			classes = append(classes, doc.DeviceClass)
		}
	}
	for _, dc := range classes {
		dc.TypeMeta = metav1.TypeMeta{}
		if _, err := c.ResourceV1().DeviceClasses().Create(ctx, &dc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create the DeviceClass dpkit deviceclass printed:\n%s\n%v", out, err)
		}
		names = append(names, dc.Name)
		t.Cleanup(func() {
			_ = c.ResourceV1().DeviceClasses().Delete(context.Background(), dc.Name, metav1.DeleteOptions{})
		})
	}
	if len(names) == 0 {
		t.Fatalf("dpkit deviceclass %v printed no DeviceClass:\n%s", args, out)
	}
	return names
}

// TestDeviceClassExamplesApply: what dpkit deviceclass prints for the
// shipped nvidia configs is accepted by a real API server.
func TestDeviceClassExamplesApply(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	examples := filepath.Join("..", "..", "examples")
	names := applyDeviceClasses(t, ctx, cp.Client(), "--config", filepath.Join(examples, "nvidia.yaml"), "--all")
	names = append(names, applyDeviceClasses(t, ctx, cp.Client(), "--config", filepath.Join(examples, "nvidia-dra.yaml"), "-o", "json")...)
	for _, n := range names {
		dc, err := cp.Client().ResourceV1().DeviceClasses().Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if dc.Spec.ExtendedResourceName == nil || *dc.Spec.ExtendedResourceName != "nvidia.com/gpu" {
			t.Errorf("DeviceClass %s: extendedResourceName %v, want nvidia.com/gpu", n, dc.Spec.ExtendedResourceName)
		}
	}
}

// holding is who holds which device at one moment, as the node's
// PodResources API and the API server's claims say.
type holding map[string][]string // device ID -> pods

// TestVirtualNodeBothFronts: one fake plugin serves 4 devices through the
// device plugin API and DRA on a dpkit node at once; 200 pods, at random
// asking the extended resource or a ResourceClaim for one device, are
// created and deleted concurrently (the claims made from a template by
// kube-controller-manager). No device is ever held by two pods:
// the node's PodResources (devices and dynamic_resources) and the running
// pods' claims are checked after every pod change.
func TestVirtualNodeBothFronts(t *testing.T) {
	// kube-controller-manager makes the pods' claims from their template
	// and deletes them when the pods are gone.
	cp := controlplane.StartForTest(t, controlplane.Options{Scheduler: true, ControllerManager: true})
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	node := unique("vn-fronts")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, node, root, nil)
	f := startBothFronts(t, ctx, c, cp.Kubeconfig, node, root, 4)
	class := applyDeviceClasses(t, ctx, c, "--config", f.config)[0]
	ns := createNamespace(t, c, "vn-fronts")
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name:    "dev",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
		}}}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	prc := dialPodResources(t, ctx, root)

	var (
		mu     sync.Mutex
		checks int
	)
	check := func() {
		h, err := holders(ctx, c, prc, ns, f)
		if err != nil {
			t.Errorf("reading who holds the devices: %v", err)
			return
		}
		mu.Lock()
		checks++
		mu.Unlock()
		for dev, pods := range h {
			if len(pods) > 1 {
				t.Errorf("device %s held by %d pods at once: %v", dev, len(pods), pods)
			}
		}
	}

	total := 200
	if testing.Short() {
		total = 40
	}
	ran, refusals := churnFronts(t, ctx, c, ns, node, f.resource, "one", total, 1, check)
	// Every pod gone, every device back in both fronts.
	poll(t, ctx, "every pod of "+ns+" gone", func(ctx context.Context) (bool, string, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		return len(list.Items) == 0, fmt.Sprintf("%d pods", len(list.Items)), nil
	})
	poll(t, ctx, "all devices back in the ResourceSlice", func(ctx context.Context) (bool, string, error) {
		names, err := sliceDevices(ctx, c, node, f.driver)
		slices.Sort(names)
		return slices.Equal(names, f.devices), fmt.Sprintf("devices %v", names), err
	})
	check()
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for k := range ran {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		t.Logf("%s: %d pods", k, ran[k])
	}
	t.Logf("%d checks of PodResources and claims; refusals: %v", checks, refusals)
	if ran["deviceplugin running"] == 0 || ran["dra running"] == 0 {
		t.Errorf("both fronts must have run pods: %v", ran)
	}
}

// waitOutcome waits until the pod runs or is refused, or gives up on a
// pod still waiting (its device held through the other front); quick
// skips waiting for it to run, so pods are also deleted while pending.
func waitOutcome(ctx context.Context, c kubernetes.Interface, ns, name string, quick bool) string {
	wctx, cancel := context.WithTimeout(ctx, waitTimeout/6)
	defer cancel()
	last := "pending"
	for {
		p, err := c.CoreV1().Pods(ns).Get(wctx, name, metav1.GetOptions{})
		if err == nil {
			switch p.Status.Phase {
			case corev1.PodRunning:
				return "running"
			case corev1.PodFailed:
				return "refused (" + p.Status.Reason + ": " + p.Status.Message + ")"
			}
			if quick {
				return "deleted pending"
			}
			for _, cs := range p.Status.ContainerStatuses {
				if cs.State.Waiting != nil && cs.State.Waiting.Message != "" {
					last = "waiting: " + cs.State.Waiting.Message
				}
			}
		}
		select {
		case <-wctx.Done():
			return "gave up " + last
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// holders returns which pods hold each device of f now: the device plugin
// front's devices and the DRA front's prepared claims from the node's
// PodResources, and the allocations of the claims of running pods.
func holders(ctx context.Context, c kubernetes.Interface, prc podresourcesv1.PodResourcesListerClient, ns string, f *bothFronts) (holding, error) {
	h := holding{}
	add := func(dev, pod string) {
		if !slices.Contains(h[dev], pod) {
			h[dev] = append(h[dev], pod)
		}
	}
	byName := map[string]string{}
	for _, id := range f.devices {
		byName[draplugin.DeviceName(id)] = id
	}
	resp, err := prc.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	for _, p := range resp.GetPodResources() {
		for _, ctr := range p.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() == f.resource {
					for _, id := range d.GetDeviceIds() {
						add(id, p.GetName())
					}
				}
			}
			for _, dr := range ctr.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					if cr.GetDriverName() == f.driver {
						add(byName[cr.GetDeviceName()], p.GetName())
					}
				}
			}
		}
	}
	pods, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			claim, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, err
			}
			if claim.Status.Allocation == nil {
				continue
			}
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver == f.driver {
					add(byName[r.Device], p.Name)
				}
			}
		}
	}
	return h, nil
}

// TestVirtualNodeDRAFirstAvailable: a claim with a prioritized list
// (firstAvailable: three devices, else one) on a node of two devices
// served by the fake plugin's DRA front is allocated by kube-scheduler as
// subrequest "dev/one"; the container that names request "dev" gets the
// claim's CDI device (reported under "dev", as the kubelet matches it).
func TestVirtualNodeDRAFirstAvailable(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	node := unique("vn-first")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, node, root, nil)
	f := startBothFronts(t, ctx, c, cp.Kubeconfig, node, root, 2)
	class := applyDeviceClasses(t, ctx, c, "--config", f.config)[0]
	ns := createNamespace(t, c, "vn-first")
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pick"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "dev",
			FirstAvailable: []resourcev1.DeviceSubRequest{
				{Name: "three", DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 3},
				{Name: "one", DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
			},
		}}}},
	}
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := claimPod(ns, "named", node, "pick", []string{"sh", "-c", "echo cdi=$" + virtualnode.CDIDevicesEnv})
	pod.Spec.Containers[0].Resources.Claims[0].Request = "dev"
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "named", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	got, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "pick", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := got.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Request != "dev/one" {
		t.Fatalf("claim allocation %+v, want one device for subrequest dev/one", got.Status.Allocation)
	}
	b, err := c.CoreV1().Pods(ns).GetLogs("named", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := "cdi=" + f.driver + "/claim=" + string(got.UID) + "-dev"
	if !strings.Contains(string(b), want) {
		t.Fatalf("log of the container naming request dev: %q, want %q (the claim's CDI device)", b, want)
	}
}

// churnFronts runs total pods on node through 6 workers: each pod asks, at
// random, one device of the extended resource res or a claim from the
// template tmpl; it is created, waited for (running, refused, or given up;
// a quarter are deleted while pending), checked, deleted at once and
// checked again. It returns the outcomes by "deviceplugin <outcome>" and
// "dra <outcome>", and the refusals.
func churnFronts(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, node, res, tmpl string, total int, seed uint64, check func()) (map[string]int, []string) {
	t.Helper()
	var (
		mu       sync.Mutex
		ran      = map[string]int{}
		refusals []string
	)
	const workers = 6
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for i := w; i < total; i += workers {
				name := fmt.Sprintf("p%03d", i)
				kind := "deviceplugin"
				pod := devicePod(ns, name, node, "0", []string{"sleep", "600"})
				if rng.IntN(2) == 0 {
					kind = "dra"
					pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}
					pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: ptr(tmpl)}}
				} else {
					pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceName(res): resource.MustParse("1")}}
				}
				if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
					t.Errorf("create %s: %v", name, err)
					return
				}
				outcome := waitOutcome(ctx, c, ns, name, rng.IntN(4) == 0)
				mu.Lock()
				ran[kind+" "+outcome]++
				if strings.HasPrefix(outcome, "refused") {
					refusals = append(refusals, name+": "+outcome)
				}
				mu.Unlock()
				check()
				if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("delete %s: %v", name, err)
				}
				check()
			}
		})
	}
	wg.Wait()
	return ran, refusals
}
