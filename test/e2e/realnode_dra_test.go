package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/imagespec"
	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/test/controlplane"
)

// fullImage is the full image (dpkit-cluster as dpkit) the tests build from
// this tree and import into the node: what the DRA front runs in.
const fullImage = "dpkit.test/dpkit:e2e"

// fullImg is cmd/dpkit-cluster and its image, as `make images` builds
// them.
var fullImg = &testImage{
	pkg: "./cmd/dpkit-cluster", flags: []string{"-ldflags", "-s -w"},
	image: func(bin string) ociimage.Image {
		return imagespec.Full(imagespec.Input{Binary: bin, Name: fullImage, Version: "e2e"})
	},
}

// importFullImage imports the full image into the node.
func importFullImage(t *testing.T, n *controlplane.Node) { t.Helper(); fullImg.importInto(t, n) }

// TestRealNodeDRA deploys the generic plugin with the DRA front only from
// deploy/overlays/generic-dra (the full image, as users do) on the real
// node (containerd 2.x; the kubelet of DPKIT_KUBELET_VERSION, v1.37 by
// default): its ResourceSlice is published for
// the node; the DeviceClass dpkit deviceclass prints is applied; a pod with
// a ResourceClaim gets the device through the CDI spec the front wrote for
// the claim (the device node and the env, read back from the pod's log),
// and so does a pod asking the DeviceClass's extended resource name, which
// the node serves only through DRA (kubelets v1.36 and newer; an older one
// runs the pod without its device, which the test checks too).
//
// Then the resource switches to the device plugin front alone ([dra] to
// [deviceplugin], a rolling update with maxSurge 1) while both pods run:
// the driver stays, retired, with its pool empty, so the pods can end
// (the kubelet unprepares their claims through it); the new instance does
// not offer the devices the claims hold, a pod asking the resource
// through the device plugin gets the one the ended pod freed, and the
// claimed device is offered again once its pod is gone.
func TestRealNodeDRA(t *testing.T) {
	cp, n := realNode.Get(t)
	importFullImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	res := "e2e.dpkit.io/zero-dra"
	driver := resourcename.DriverName(res)
	// The test node has no Service proxy: the plugin reaches the API
	// server on the host's loopback, with a kubeconfig from a Secret.
	config := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\ndra:\n  kubeconfig: /etc/dpkit-kube/kubeconfig\nplugins:\n- generic:\n" + indent(zeroConfig(res), "    ") + "  fronts: [dra]\n"

	d, dir := deployFullImage(t, ctx, cp, n, config, res, surge)
	poll(t, ctx, "the DRA front's ResourceSlice for "+n.Name, func(ctx context.Context) (bool, string, error) {
		names, err := sliceDevices(ctx, c, n.Name, driver)
		return len(names) == 2, fmt.Sprintf("devices %v", names), err
	})
	// Ready means registered with the kubelet: a pod whose claims the
	// kubelet tries to prepare sooner waits for its next sync (a minute).
	poll(t, ctx, "DaemonSet "+d.daemonSet+" ready", func(ctx context.Context) (bool, string, error) {
		ds, err := c.AppsV1().DaemonSets(d.namespace).Get(ctx, d.daemonSet, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return ds.Status.NumberReady == 1, fmt.Sprintf("%+v", ds.Status), nil
	})
	if node, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if q, ok := node.Status.Allocatable[corev1.ResourceName(res)]; ok && !q.IsZero() {
		t.Fatalf("node allocatable %s = %s: the resource has only the dra front", res, q.String())
	}
	class := applyDeviceClasses(t, ctx, c, "--config", filepath.Join(dir, "plugin.yaml"))[0]

	ns := createNamespace(t, c, "dra")
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "zero", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claimPod := zeroPod(ns, "claim", corev1.ResourceName(res), "1")
	claimPod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "zero"}}}
	claimPod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "zero", ResourceClaimName: ptr("zero")}}
	extPod := zeroPod(ns, "extended", corev1.ResourceName(res), "1")
	for _, p := range []*corev1.Pod{claimPod, extPod} {
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				describePod(t, c, ns, p.Name)
			}
			deletePodAndWait(t, c, ns, p.Name)
		})
	}
	for _, p := range []string{"claim", "extended"} {
		waitPod(t, ctx, c, ns, p, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		if p == "extended" && controlplane.KubeletMinor() < 36 {
			// The v1.37 scheduler serves the name through DRA, but a
			// kubelet before v1.36 has DRAExtendedResource off: it neither
			// prepares the claim nor refuses the pod, which runs without a
			// device (measured; docs/dra.md, "Every kubelet").
			logs := podLogsWith(t, ctx, c, ns, p, "read:")
			if strings.Contains(logs, "DPKIT_E2E=from the plugin") {
				t.Errorf("kubelet %s served the DRA extended resource:\n%s", controlplane.KubeletVersion(), logs)
			}
			t.Logf("skew: kubelet %s: DRA extended resource: the pod runs without its device (DRAExtendedResource off in the kubelet)", controlplane.KubeletVersion())
			continue
		}
		t.Logf("pod %s log:\n%s", p, wantDeviceLogs(t, ctx, c, ns, p))
		t.Logf("skew: kubelet %s: DRA front, %s pod: runs with its device", controlplane.KubeletVersion(), p)
	}
	ext, err := c.CoreV1().Pods(ns).Get(ctx, "extended", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ext.Status.ExtendedResourceClaimStatus == nil {
		t.Errorf("pod asking %s has no extendedResourceClaimStatus: the node served it some other way", res)
	}
	// The claims' CDI specs are on the node while the pods run.
	specs, _ := filepath.Glob(filepath.Join(n.CDIDir, "dpkit-dra-"+driver+"-*.json"))
	wantSpecs := 2
	if controlplane.KubeletMinor() < 36 {
		wantSpecs = 1 // the extended resource's claim is not prepared
	}
	if len(specs) != wantSpecs {
		t.Errorf("CDI specs of prepared claims in the node's CDI directory: %v, want %d", specs, wantSpecs)
	}
	var claims resourcev1.ResourceClaimList
	if l, err := c.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{}); err == nil {
		claims = *l
	}
	claimed := ""
	for _, cl := range claims.Items {
		if cl.Status.Allocation != nil {
			t.Logf("claim %s: %+v", cl.Name, cl.Status.Allocation.Devices.Results)
			if cl.Name == "zero" {
				claimed = cl.Status.Allocation.Devices.Results[0].Device
			}
		}
	}
	if claimed == "" {
		t.Fatal("claim zero has no device allocated")
	}

	switchConfig(t, ctx, c, d, strings.Replace(config, "fronts: [dra]", "fronts: [deviceplugin]", 1), 9402)
	// The driver stays, retired, to unprepare the claims: its pool is
	// empty, and the pods using them can end.
	poll(t, ctx, "the retired driver's ResourceSlice empty", func(ctx context.Context) (bool, string, error) {
		names, err := sliceDevices(ctx, c, n.Name, driver)
		return err == nil && len(names) == 0, fmt.Sprintf("devices %v", names), err
	})
	deletePodAndWait(t, c, ns, "extended")
	// One device offered: the claim still holds the other.
	waitAllocatableAt(t, ctx, n, corev1.ResourceName(res), 1)
	t.Logf("switched to [deviceplugin]: the extended resource's pod ended, 1 device offered while claim zero holds %s", claimed)
	runDevicePod(t, ctx, c, ns, "after", corev1.ResourceName(res), "1")
	wantDeviceLogs(t, ctx, c, ns, "after")
	got := podDevices(t, ctx, n, ns, "after")
	if len(got) != 1 || resourcename.DRADeviceName(got[0]) == claimed {
		t.Errorf("the device plugin pod got %v; the claim holds %s", got, claimed)
	}
	deletePodAndWait(t, c, ns, "claim")
	waitAllocatableAt(t, ctx, n, corev1.ResourceName(res), 2)
	t.Logf("the device plugin pod got %v; the claim's pod ended and both devices are offered", got)
}

// switchConfig puts config into the plugin's ConfigMap and rolls its
// DaemonSet to it (the metrics port moved to port, for the surge pod's
// host networking), waiting until the old pod is gone and the new one
// ready.
func switchConfig(t *testing.T, ctx context.Context, c kubernetes.Interface, d deployment, config string, port int32) {
	t.Helper()
	configMap := ""
	for _, o := range d.objs {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "dpkit-plugin-config") {
			configMap = o.GetName()
		}
	}
	cm, err := c.CoreV1().ConfigMaps(d.namespace).Get(ctx, configMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["config.yaml"] = config
	if _, err := c.CoreV1().ConfigMaps(d.namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := ""
	poll(t, ctx, "the plugin's pod", func(ctx context.Context) (bool, string, error) {
		pods, err := c.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		for _, p := range pods.Items {
			if strings.HasPrefix(p.Name, d.daemonSet+"-") && p.DeletionTimestamp == nil && podReady(&p) {
				old = p.Name
			}
		}
		return old != "", fmt.Sprint(len(pods.Items), " pods"), nil
	})
	if err := rollToPort(ctx, c, d, port); err != nil {
		t.Fatal(err)
	}
	if err := waitRolledOut(ctx, c, d, old); err != nil {
		t.Fatal(err)
	}
}

// podLogsWith waits until the pod's log holds want and returns it.
func podLogsWith(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name, want string) string {
	t.Helper()
	var logs string
	poll(t, ctx, "log of "+ns+"/"+name+" with "+want, func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, want), logs, nil
	})
	return logs
}

// logPlugin logs the status and log of the DaemonSet's pods, for a failed
// test.
func (d deployment) logPlugin(t *testing.T, c kubernetes.Interface) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods, err := c.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("list the plugin's pods: %v", err)
		return
	}
	for _, p := range pods.Items {
		if !strings.HasPrefix(p.Name, d.daemonSet) {
			continue
		}
		t.Logf("plugin pod %s: phase %s containers %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		b, err := c.CoreV1().Pods(d.namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		t.Logf("plugin pod %s log (%v):\n%s", p.Name, err, b)
	}
}

// surge makes a DaemonSet roll with maxSurge 1 and maxUnavailable 0: the
// new pod starts beside the old one.
func surge(t *testing.T, o *unstructured.Unstructured) {
	if err := unstructured.SetNestedMap(o.Object, map[string]any{
		"type": "RollingUpdate", "rollingUpdate": map[string]any{"maxSurge": int64(1), "maxUnavailable": int64(0)},
	}, "spec", "updateStrategy"); err != nil {
		t.Fatal(err)
	}
}

// rollToPort rolls the plugin's DaemonSet to a pod template whose metrics
// port (and so its probes' and --metrics-address) is port: with host
// networking (the test node's way to the API server) the surge pod could
// not hold the old pod's port, and the scheduler would keep it Pending.
func rollToPort(ctx context.Context, c kubernetes.Interface, d deployment, port int32) error {
	ds, err := c.AppsV1().DaemonSets(d.namespace).Get(ctx, d.daemonSet, metav1.GetOptions{})
	if err != nil {
		return err
	}
	setMetricsPort(ds, port)
	_, err = c.AppsV1().DaemonSets(d.namespace).Update(ctx, ds, metav1.UpdateOptions{})
	return err
}

// TestRealNodeRollingUpdateDRA rolls the plugin's DaemonSet (full image,
// both fronts, maxSurge 1, POD_UID from the downward API as
// deploy/components/dra sets it) while pods with claims
// and with the extended resource are created: the new instance serves
// beside the old one on sockets of its own, no Prepare fails, no pod is
// refused, the Node's allocatable never drops to 0, and every pod runs
// with its device.
func TestRealNodeRollingUpdateDRA(t *testing.T) {
	cp, n := realNode.Get(t)
	importFullImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	// One plugin process with both fronts, each on a resource of its own:
	// one resource on both fronts has a race of its own (docs/dra-plugins.md,
	// Limits) that is not the rolling update's.
	res, draRes := "e2e.dpkit.io/zero-roll", "e2e.dpkit.io/zero-roll-dra"
	entry := func(name, fronts string) string {
		return "- generic:\n" + indent(strings.Replace(zeroConfig(name), "count: 2", "count: 4", 1), "    ") + "  fronts: [" + fronts + "]\n"
	}
	config := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\ndra:\n  kubeconfig: /etc/dpkit-kube/kubeconfig\nplugins:\n" +
		entry(res, "deviceplugin") + entry(draRes, "dra")
	d, dir := deployFullImage(t, ctx, cp, n, config, res, surge)
	old := d.waitPluginReady(t, ctx, c, n.Name, "4")
	driver := resourcename.DriverName(draRes)
	poll(t, ctx, "the DRA front's ResourceSlice", func(ctx context.Context) (bool, string, error) {
		names, err := sliceDevices(ctx, c, n.Name, driver)
		return len(names) == 4, fmt.Sprintf("devices %v", names), err
	})
	classes := applyDeviceClasses(t, ctx, c, "--config", filepath.Join(dir, "plugin.yaml"))
	if len(classes) != 1 {
		t.Fatalf("DeviceClasses %v, want the DRA resource's", classes)
	}
	class := classes[0]
	ns := createNamespace(t, c, "roll-dra")
	pods := 0
	start := func(kind string) {
		pods++
		name := fmt.Sprintf("%s-%d", kind, pods)
		p := zeroPod(ns, name, corev1.ResourceName(res), "1")
		if kind == "claim" {
			if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, name, class, 1), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimName: ptr(name)}}
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				describePod(t, c, ns, name)
			}
			deletePodAndWait(t, c, ns, name)
		})
	}
	start("claim")
	start("extended")

	stop := watchAllocatable(t, ctx, c, n.Name, corev1.ResourceName(res))
	if err := rollToPort(ctx, c, d, 9401); err != nil {
		t.Fatal(err)
	}
	// Pods come while both instances serve.
	for range 2 {
		start("claim")
		start("extended")
	}
	rollErr := waitRolledOut(ctx, c, d, old.Name)
	seen, lowest := stop()
	if rollErr != nil {
		t.Fatal(rollErr)
	}
	t.Logf("allocatable %s during the rollout: %v", res, seen)
	checkRolloutAllocatable(t, corev1.ResourceName(res), seen, lowest)
	waitAllocatable(t, ctx, c, n.Name, corev1.ResourceName(res), "4")
	start("claim") // and after it
	for i := 1; i <= pods; i++ {
		kind := "claim" // started alternately, claims first
		if i%2 == 0 {
			kind = "extended"
		}
		name := fmt.Sprintf("%s-%d", kind, i)
		waitPod(t, ctx, c, ns, name, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		wantDeviceLogs(t, ctx, c, ns, name)
	}
	events, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		if ev.Type == corev1.EventTypeWarning && ev.Reason != "MissingClusterDNS" { // the test node has no cluster DNS
			t.Errorf("pod %s: %s: %s", ev.InvolvedObject.Name, ev.Reason, ev.Message)
		}
	}
}

// deployFullImage deploys the plugin config from deploy/overlays/generic-dra
// in the full image (imported into the node first), as a user's overlay
// does: the config in the ConfigMap, the API server's kubeconfig from a
// Secret (the test node has no Service proxy), host networking. It
// returns the deployment (res is its resource) and the overlay's
// directory, which holds the config as plugin.yaml.
func deployFullImage(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, n *controlplane.Node, config, res string, edits ...func(*testing.T, *unstructured.Unstructured)) (deployment, string) {
	t.Helper()
	importFullImage(t, n)
	c := cp.Client()
	kubeconfig, err := os.ReadFile(cp.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dir := fullImageOverlay(t, filepath.Join("deploy", "overlays", "generic-dra"), "dpkit-system", kubeconfig, `configMapGenerator:
- name: dpkit-plugin-config
  namespace: dpkit-system
  behavior: replace
  files:
  - config.yaml
`, `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: dpkit-plugin
  namespace: dpkit-system
spec:
  template:
    spec:
      hostNetwork: true
      # Only the real node: the suite's virtual nodes are Nodes too.
      nodeSelector:
        kubernetes.io/hostname: `+n.Name+`
      containers:
      - name: plugin
        volumeMounts:
        - name: e2e-kubeconfig
          mountPath: /etc/dpkit-kube
          readOnly: true
      volumes:
      - name: e2e-kubeconfig
        secret:
          secretName: dpkit-e2e-kubeconfig
`)
	writeFile(t, filepath.Join(dir, "config.yaml"), config)
	writeFile(t, filepath.Join(dir, "plugin.yaml"), config)
	d := deployment{objs: render(t, "kustomize", dir), resource: corev1.ResourceName(res)}
	for _, o := range d.objs {
		if o.GetKind() == "DaemonSet" {
			d.namespace, d.daemonSet = o.GetNamespace(), o.GetName()
			for _, edit := range edits {
				edit(t, o)
			}
		}
	}
	d.apply(t, ctx, cp)
	t.Cleanup(func() {
		if t.Failed() {
			d.logPlugin(t, c)
			logTail(t, n.LogPath("kubelet"))
		}
	})
	return d, dir
}

// fullImageOverlay writes a kustomization over base (a directory of the
// repository) in a new directory and returns it: the full image the suite
// imported into the node, a Secret dpkit-e2e-kubeconfig in namespace
// holding kubeconfig (the test node has no Service proxy, so in-cluster
// configuration cannot reach the API server), the generators in extra,
// and patch as patch.yaml.
func fullImageOverlay(t *testing.T, base, namespace string, kubeconfig []byte, extra, patch string) string {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(filepath.Join("..", "..", base))
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(fullImage, ":")
	writeFile(t, filepath.Join(dir, "kustomization.yaml"), `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- `+rel+`
images:
- name: `+imagespec.FullRepository+`
  newName: `+name+`
  newTag: `+tag+`
`+extra+`secretGenerator:
- name: dpkit-e2e-kubeconfig
  namespace: `+namespace+`
  files:
  - kubeconfig
patches:
- path: patch.yaml
`)
	writeFile(t, filepath.Join(dir, "kubeconfig"), string(kubeconfig))
	writeFile(t, filepath.Join(dir, "patch.yaml"), patch)
	return dir
}
