package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/imagespec"
	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
	"github.com/dpkit/dpkit/test/controlplane"
)

// realNode is a control plane with kube-controller-manager and a real
// node (kubelet, containerd, runc) shared by the TestRealNode* tests; it
// starts on first use. Each test deploys the plugin with its own resource
// name and removes what it deployed.
var realNode = controlplane.NewSharedNode(controlplane.Options{}, controlplane.NodeOptions{})

// pluginImage is the lean plugin image the tests build from this tree and
// import into the node: the image `make image` writes, under a test name.
const pluginImage = "dpkit.test/dpkit-plugin:e2e"

// testImage is an image the tests build from this tree (a Go package,
// packed by image) and import into the node, once per test run.
type testImage struct {
	pkg   string
	flags []string // go build's, beside -trimpath
	image func(bin string) ociimage.Image
	once  sync.Once
	err   error
}

// importInto builds the image (the first time) and imports it into n.
func (im *testImage) importInto(t *testing.T, n *controlplane.Node) {
	t.Helper()
	im.once.Do(func() {
		dir, err := os.MkdirTemp("", "dpkit-e2e-image")
		if err != nil {
			im.err = err
			return
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, filepath.Base(im.pkg))
		cmd := exec.Command("go", append(append([]string{"build", "-trimpath"}, im.flags...), "-o", bin, im.pkg)...)
		cmd.Dir = filepath.Join("..", "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			im.err = fmt.Errorf("build %s: %w\n%s", im.pkg, err, out)
			return
		}
		archive := filepath.Join(dir, "image.oci.tar")
		if _, err := ociimage.WriteFile(archive, im.image(bin)); err != nil {
			im.err = err
			return
		}
		im.err = n.ImportImage(context.Background(), archive)
	})
	if im.err != nil {
		t.Fatal(im.err)
	}
}

// pluginImg is the lean binary and its image, as `make image` builds
// them.
var pluginImg = &testImage{
	pkg: "./cmd/dpkit", flags: []string{"-tags", "dpkit_lean grpcnotrace", "-ldflags", "-s -w"},
	image: func(bin string) ociimage.Image {
		return imagespec.Plugin(imagespec.Input{Binary: bin, Name: pluginImage, Version: "e2e"})
	},
}

// importPluginImage imports the lean plugin image into the node.
func importPluginImage(t *testing.T, n *controlplane.Node) { t.Helper(); pluginImg.importInto(t, n) }

// zeroConfig is the generic plugin's group for the tests: /dev/zero, which
// every Linux machine has, shared by two containers, shown as
// /dev/dpkit-zero, with an environment variable.
func zeroConfig(resourceName string) string {
	return zeroConfigCDI(resourceName, false)
}

// zeroConfigCDI is zeroConfig, with CDI on: the plugin writes a CDI spec
// into /var/run/cdi and answers Allocate with CDI names only, so the
// device reaches the container only through containerd's CDI injection.
func zeroConfigCDI(resourceName string, cdi bool) string {
	return "cdi:\n  enabled: " + fmt.Sprint(cdi) + "\n" + `groups:
- name: ` + resourceName + `
  paths:
  - path: /dev/zero
    containerPath: /dev/dpkit-zero
  count: 2
  env:
    DPKIT_E2E: from the plugin
`
}

// deployment is what one way of deploying rendered and applied.
type deployment struct {
	objs      []*unstructured.Unstructured
	namespace string
	daemonSet string
	resource  corev1.ResourceName
}

// deployKustomize renders deploy/overlays/generic through an overlay of
// the kind a user writes: the local image, the test's plugin config.
func deployKustomize(t *testing.T, resourceName string) deployment {
	t.Helper()
	return deployKustomizeConfig(t, resourceName, zeroConfig(resourceName))
}

func deployKustomizeConfig(t *testing.T, resourceName, config string) deployment {
	t.Helper()
	return deployOverlay(t, "generic", resourceName, config, "")
}

// deployOverlay renders deploy/overlays/<plugin> through an overlay of the
// kind a user writes: the local image, the plugin's section of the config
// file, and a strategic-merge patch of the DaemonSet when patch is not
// empty.
func deployOverlay(t *testing.T, plugin, resourceName, config, patch string) deployment {
	t.Helper()
	dir := t.TempDir()
	overlay, err := filepath.Abs(filepath.Join("..", "..", "deploy", "overlays", plugin))
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, overlay)
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(pluginImage, ":")
	kust := `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ` + rel + `
images:
- name: ` + imagespec.PluginRepository + `
  newName: ` + name + `
  newTag: ` + tag + `
configMapGenerator:
# The base's name and namespace: kustomize matches generators by the
# original name, before the overlay's suffix.
- name: dpkit-plugin-config
  namespace: dpkit-system
  behavior: replace
  files:
  - config.yaml
`
	if patch != "" {
		kust += "patches:\n- path: patch.yaml\n"
		writeFile(t, filepath.Join(dir, "patch.yaml"), patch)
	}
	cfg := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- " + plugin + ":\n" + indent(config, "    ")
	writeFile(t, filepath.Join(dir, "kustomization.yaml"), kust)
	writeFile(t, filepath.Join(dir, "config.yaml"), cfg)
	return deploymentOf(t, render(t, "kustomize", dir), resourceName)
}

// deployHelm renders the chart with the generic plugin enabled.
func deployHelm(t *testing.T, resourceName string) deployment {
	t.Helper()
	name, tag, _ := strings.Cut(pluginImage, ":")
	values := filepath.Join(t.TempDir(), "values.yaml")
	writeFile(t, values, "image:\n  repository: "+name+"\n  tag: "+tag+"\n  pullPolicy: Never\nplugins:\n  generic:\n    enabled: true\n    config:\n"+indent(zeroConfig(resourceName), "      "))
	return deploymentOf(t, render(t, "helm", filepath.Join("..", "..", "deploy", "helm", "dpkit"), "-f", values), resourceName)
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i := range lines {
		lines[i] = prefix + lines[i]
	}
	return strings.Join(lines, "\n") + "\n"
}

func deploymentOf(t *testing.T, objs []*unstructured.Unstructured, resourceName string) deployment {
	t.Helper()
	d := deployment{objs: objs, resource: corev1.ResourceName(resourceName)}
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			d.namespace, d.daemonSet = o.GetNamespace(), o.GetName()
			if d.namespace == "" {
				d.namespace = "dpkit-system"
			}
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			if len(containers) == 0 || containers[0].(map[string]any)["image"] != pluginImage {
				t.Fatalf("rendered DaemonSet %s runs %v, want image %s", o.GetName(), containers, pluginImage)
			}
		}
	}
	if d.daemonSet == "" {
		t.Fatal("nothing rendered a DaemonSet")
	}
	return d
}

// apply creates the rendered objects with server-side apply, namespaces
// first, and deletes them when the test ends.
func (d deployment) apply(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cp.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	objs := append([]*unstructured.Unstructured(nil), d.objs...)
	sort.SliceStable(objs, func(i, j int) bool { return objs[i].GetKind() == "Namespace" && objs[j].GetKind() != "Namespace" })
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s %s: %v", gvk, o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			if o.GetNamespace() == "" {
				o.SetNamespace(d.namespace)
			}
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		body, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "dpkit-e2e", Force: &force}); err != nil {
			t.Fatalf("apply %s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
		if o.GetKind() == "Namespace" {
			continue // other tests deploy into it too
		}
		t.Cleanup(func() {
			err := ri.Delete(context.Background(), o.GetName(), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s %s: %v", gvk.Kind, o.GetName(), err)
			}
		})
	}
}

// waitPluginReady waits for the DaemonSet's one pod to be Ready (its
// readiness probe reached over the pod network) and the resource to be
// allocatable on the Node.
func (d deployment) waitPluginReady(t *testing.T, ctx context.Context, c kubernetes.Interface, node, amount string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	poll(t, ctx, "DaemonSet "+d.daemonSet+" ready", func(ctx context.Context) (bool, string, error) {
		ds, err := c.AppsV1().DaemonSets(d.namespace).Get(ctx, d.daemonSet, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pods, err := c.CoreV1().Pods(d.namespace).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(ds.Spec.Selector)})
		if err != nil {
			return false, "", err
		}
		var states []string
		for i := range pods.Items {
			p := &pods.Items[i]
			states = append(states, fmt.Sprintf("%s %s %v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
			if p.DeletionTimestamp == nil && podReady(p) {
				pod = p
			}
		}
		return pod != nil && ds.Status.NumberReady == 1, fmt.Sprintf("DaemonSet status %+v; pods %v", ds.Status, states), nil
	})
	waitAllocatable(t, ctx, c, node, d.resource, amount)
	return pod
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitAllocatable(t *testing.T, ctx context.Context, c kubernetes.Interface, node string, res corev1.ResourceName, amount string) {
	t.Helper()
	poll(t, ctx, fmt.Sprintf("node %s allocatable %s=%s", node, res, amount), func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		q, ok := n.Status.Allocatable[res]
		return ok && q.Cmp(resource.MustParse(amount)) == 0, fmt.Sprintf("allocatable %v", n.Status.Allocatable), nil
	})
}

// zeroPod is a busybox pod asking for n of res that prints the plugin's
// env and its device node, then sleeps.
func zeroPod(ns, name string, res corev1.ResourceName, n string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", `echo "DPKIT_E2E=$DPKIT_E2E"; ls -l /dev/dpkit-zero; echo "read: $(head -c 3 /dev/dpkit-zero | od -An -tx1)"; trap "exit 0" TERM; sleep 3600 & wait`},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse(n)}},
			}},
		},
	}
}

func runDevicePod(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string, res corev1.ResourceName, n string) *corev1.Pod {
	t.Helper()
	if _, err := c.CoreV1().Pods(ns).Create(ctx, zeroPod(ns, name, res, n), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, ns, name)
		}
		deletePodAndWait(t, c, ns, name)
	})
	return waitPod(t, ctx, c, ns, name, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning && podReady(p) })
}

// deletePodAndWait deletes a pod with a grace period its command honours
// (the tests' commands end on SIGTERM) and waits until the node has
// removed it: a kubelet deletes the pod object only once its containers
// have stopped, so the test leaves nothing running on the node. A force
// deletion (grace 0) would remove the object at once and leave the
// containers to the kubelet, still running when the test ends.
func deletePodAndWait(t *testing.T, c kubernetes.Interface, ns, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(10))})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("delete pod %s/%s: %v", ns, name, err)
		return
	}
	poll(t, ctx, "pod "+ns+"/"+name+" stopped and removed by its node", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, err.Error(), nil
		}
		return false, fmt.Sprintf("phase %s", p.Status.Phase), nil
	})
}

// describePod logs a pod's status and events, for a failed test.
func describePod(t *testing.T, c kubernetes.Interface, ns, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
		t.Logf("pod %s/%s: phase %s reason %q message %q node %q\n  conditions %+v\n  containers %+v", ns, name, p.Status.Phase, p.Status.Reason, p.Status.Message, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
	}
	if evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name}); err == nil {
		for _, e := range evs.Items {
			t.Logf("event %s %s: %s", e.Reason, e.Source.Component, e.Message)
		}
	}
}

// wantDeviceLogs reads the pod's log through the apiserver (what kubectl
// logs does) until it shows the plugin's env and device node.
func wantDeviceLogs(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string) string {
	t.Helper()
	var logs string
	poll(t, ctx, "log of "+ns+"/"+name, func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		// /dev/zero is character device 1, 5; reading it gives zeros.
		return strings.Contains(logs, "DPKIT_E2E=from the plugin") && strings.Contains(logs, "1,   5") &&
			strings.Contains(logs, "/dev/dpkit-zero") && strings.Contains(logs, "read:  00 00 00"), logs, nil
	})
	return logs
}

// TestRealNodeKustomize and TestRealNodeHelm deploy the generic plugin
// with the locally built lean image as users do, from the kustomize
// overlay and from the Helm chart; the resource reaches the Node's
// allocatable, a pod gets the device node and the plugin's env (read back
// through the pod log), and a pod asking for more than is left stays
// Pending.
func TestRealNodeKustomize(t *testing.T) {
	testRealNodeDeploy(t, func(t *testing.T) deployment { return deployKustomize(t, "e2e.dpkit.io/zero-kustomize") })
}

func TestRealNodeHelm(t *testing.T) {
	testRealNodeDeploy(t, func(t *testing.T) deployment { return deployHelm(t, "e2e.dpkit.io/zero-helm") })
}

func testRealNodeDeploy(t *testing.T, deploy func(*testing.T) deployment) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	d := deploy(t)
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")

	ns := createNamespace(t, c, "realnode")
	runDevicePod(t, ctx, c, ns, "one", d.resource, "1")
	logs := wantDeviceLogs(t, ctx, c, ns, "one")
	t.Logf("pod log:\n%s", logs)

	// One left; two is one too many.
	if _, err := c.CoreV1().Pods(ns).Create(ctx, zeroPod(ns, "too-many", d.resource, "2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ctx, c, ns, "too-many", "FailedScheduling", "Insufficient "+string(d.resource))
	if p, err := c.CoreV1().Pods(ns).Get(ctx, "too-many", metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Fatalf("pod asking for one too many: %v, phase %s, node %q; want Pending and unbound", err, p.Status.Phase, p.Spec.NodeName)
	}
}

// TestRealNodeCDI deploys the generic plugin with CDI on: the container
// gets the device node and the env through the CDI spec the plugin wrote,
// injected by containerd 2.x.
func TestRealNodeCDI(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	res := "e2e.dpkit.io/zero-cdi"
	d := deployKustomizeConfig(t, res, zeroConfigCDI(res, true))
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")
	specs, _ := filepath.Glob(filepath.Join(n.CDIDir, "*"))
	var spec []byte
	for _, f := range specs {
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), "zero-cdi") {
			spec = b
		}
	}
	if spec == nil {
		t.Fatalf("no CDI spec for %s in the node's /var/run/cdi (%v)", res, specs)
	}
	t.Logf("CDI spec:\n%s", spec)
	ns := createNamespace(t, c, "cdi")
	runDevicePod(t, ctx, c, ns, "one", d.resource, "1")
	t.Logf("pod log:\n%s", wantDeviceLogs(t, ctx, c, ns, "one"))
}

// TestRealNodeNvidiaCDI runs the nvidia plugin, deployed from
// deploy/overlays/nvidia, on the shipped DGX-H100 fixture host (its /dev,
// /sys and /proc mounted into the plugin's pod in place of the node's),
// with the cdi strategy and cdiSpecDir: the plugin writes a CDI spec of
// the fixture's GPUs into the node's /var/run/cdi and answers Allocate with
// CDI names only; containerd 2.x reads the spec and creates the GPU's
// device node in the container. The fixture's device nodes are plain
// files; the test makes them character devices (1:5, what /dev/zero is)
// so that the spec carries device numbers a container can use.
func TestRealNodeNvidiaCDI(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()

	host := t.TempDir()
	if out, err := exec.Command("cp", "-a", filepath.Join("..", "..", "pkg", "discovery", "testdata", "hosts", "dgx-h100")+"/.", host).CombinedOutput(); err != nil {
		t.Fatalf("copy the fixture host: %v: %s", err, out)
	}
	nodes, err := filepath.Glob(filepath.Join(host, "dev", "nvidia*"))
	if err != nil || len(nodes) != 12 {
		t.Fatalf("fixture device nodes %v (%v), want 8 GPUs, nvidiactl, 2 UVM and modeset", nodes, err)
	}
	for _, f := range nodes {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mknod(f, syscall.S_IFCHR|0o666, int(1<<8|5)); err != nil {
			t.Fatalf("mknod %s (the real node runs as root): %v", f, err)
		}
	}

	const res, kind = "e2e.dpkit.io/nvidia-gpu", "e2e.dpkit.io/gpu"
	cfg := "resourceName: " + res + "\ndeviceListStrategy: [cdi]\ncdiKind: " + kind + "\ncdiSpecDir: /var/run/cdi\n"
	patch := `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: dpkit-plugin
spec:
  template:
    spec:
      nodeSelector:
        feature.node.kubernetes.io/pci-10de.present: null
        kubernetes.io/hostname: ` + n.Name + `
      volumes:
      - name: dev
        hostPath:
          path: ` + filepath.Join(host, "dev") + `
      - name: sys
        hostPath:
          path: ` + filepath.Join(host, "sys") + `
      - name: proc
        hostPath:
          path: ` + filepath.Join(host, "proc") + `
`
	d := deployOverlay(t, "nvidia", res, cfg, patch)
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "8")

	specFile := filepath.Join(n.CDIDir, plugins.CDISpecFile(kind))
	spec, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatalf("the nvidia plugin wrote no CDI spec into the node's /var/run/cdi: %v", err)
	}
	t.Logf("CDI spec %s:\n%s", specFile, spec)

	ns := createNamespace(t, c, "nvidia-cdi")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: ns},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", `ls -l /dev/ | grep nvidia; for f in /dev/nvidia[0-9]*; do echo "gpu $f read: $(head -c 2 $f | od -An -tx1)"; done; trap "exit 0" TERM; sleep 3600 & wait`},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, ns, "gpu")
		}
		deletePodAndWait(t, c, ns, "gpu")
	})
	waitPod(t, ctx, c, ns, "gpu", "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	var logs string
	poll(t, ctx, "log of "+ns+"/gpu", func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs("gpu", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, "read:  00 00"), logs, nil
	})
	t.Logf("pod log:\n%s", logs)
	// One GPU: its node and the ones for all, each a character device
	// 1, 5 created by containerd from the spec.
	gpus := 0
	for _, line := range strings.Split(logs, "\n") {
		if strings.HasPrefix(line, "gpu /dev/nvidia") {
			gpus++
		}
	}
	if gpus != 1 {
		t.Errorf("the container has %d GPU device nodes, want the 1 it asked for:\n%s", gpus, logs)
	}
	for _, node := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
		if !strings.Contains(logs, "1,   5 ") || !strings.Contains(logs, " "+node+"\n") {
			t.Errorf("the container lacks /dev/%s as character device 1, 5:\n%s", node, logs)
		}
	}
}

// TestRealNodeKubeletRestart restarts the real kubelet under a deployed
// plugin and a pod holding a device, with SIGTERM and with SIGKILL: the
// plugin registers again and the resource is allocatable again, the
// running pod keeps its container and its device, and a new pod is
// admitted and gets the other device.
func TestRealNodeKubeletRestart(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	d := deployKustomize(t, "e2e.dpkit.io/zero-restart")
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")
	ns := createNamespace(t, c, "restart")
	holder := runDevicePod(t, ctx, c, ns, "holder", d.resource, "1")
	holderID := holder.Status.ContainerStatuses[0].ContainerID

	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			if err := n.RestartKubelet(ctx, sig); err != nil {
				t.Fatal(err)
			}
			restarted := time.Now()
			waitAllocatableAt(t, ctx, n, d.resource, 2)
			t.Logf("kubelet %v: the plugin's %d devices allocatable in the kubelet (PodResources) %v after /healthz answered", sig, 2, time.Since(restarted).Round(time.Millisecond))
			waitAllocatable(t, ctx, c, n.Name, d.resource, "2")
			t.Logf("kubelet %v: allocatable on the Node object %v after /healthz answered", sig, time.Since(restarted).Round(time.Millisecond))

			p, err := c.CoreV1().Pods(ns).Get(ctx, "holder", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].ContainerID != holderID || p.Status.ContainerStatuses[0].RestartCount != 0 {
				t.Errorf("holder's container after the restart: %+v, want %s still running", p.Status.ContainerStatuses, holderID)
			}
			poll(t, ctx, "the holder's device listed by the kubelet's PodResources again", func(ctx context.Context) (bool, string, error) {
				got := podDevices(t, ctx, n, ns, "holder")
				return len(got) == 1, fmt.Sprint(got), nil
			})
			t.Logf("kubelet %v: the holder's device listed again %v after /healthz answered", sig, time.Since(restarted).Round(time.Millisecond))
			name := fmt.Sprintf("new-%d", i)
			runDevicePod(t, ctx, c, ns, name, d.resource, "1")
			wantDeviceLogs(t, ctx, c, ns, name)
			deletePodAndWait(t, c, ns, name)
		})
	}
}

// waitAllocatableAt waits until the kubelet itself (its PodResources
// GetAllocatableResources) lists want devices of res.
func waitAllocatableAt(t *testing.T, ctx context.Context, n *controlplane.Node, res corev1.ResourceName, want int) {
	t.Helper()
	poll(t, ctx, fmt.Sprintf("%d %s allocatable in the kubelet", want, res), func(ctx context.Context) (bool, string, error) {
		got := allocatableAt(ctx, n, res)
		return got == want, fmt.Sprintf("%d", got), nil
	})
}

// allocatableAt returns how many devices of res the kubelet lists as
// allocatable (its PodResources GetAllocatableResources), -1 when it
// does not answer.
func allocatableAt(ctx context.Context, n *controlplane.Node, res corev1.ResourceName) int {
	client, closer, err := prclient.Dial(ctx, podresources.SocketPath(n.KubeletRoot))
	if err != nil {
		return -1
	}
	defer closer.Close()
	resp, err := client.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		return -1
	}
	got := 0
	for _, d := range resp.GetDevices() {
		if d.GetResourceName() == string(res) {
			got += len(d.GetDeviceIds())
		}
	}
	return got
}

// podDevices returns the device IDs the kubelet lists for a pod.
func podDevices(t *testing.T, ctx context.Context, n *controlplane.Node, ns, name string) []string {
	t.Helper()
	client, closer, err := prclient.Dial(ctx, podresources.SocketPath(n.KubeletRoot))
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	resp, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() == ns && p.GetName() == name {
			for _, c := range p.GetContainers() {
				for _, d := range c.GetDevices() {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids
}

// TestRealNodeRollingUpdate updates the plugin's DaemonSet (the
// manifests' maxSurge 1 and maxUnavailable 0) while a pod holds a device:
// the new plugin pod starts beside the old one, registers the same
// resource, and the old one stops. The Node's allocatable must never drop to 0 on the way
// (kubernetes#121994: the old plugin's exit took the new registration's
// devices away).
func TestRealNodeRollingUpdate(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	d := deployKustomize(t, "e2e.dpkit.io/zero-rolling")
	for _, o := range d.objs {
		checkPluginRollout(t, o) // the manifests' own strategy: maxSurge 1
	}
	d.apply(t, ctx, cp)
	old := d.waitPluginReady(t, ctx, c, n.Name, "2")
	ns := createNamespace(t, c, "rolling")
	runDevicePod(t, ctx, c, ns, "holder", d.resource, "1")

	stop := watchAllocatable(t, ctx, c, n.Name, d.resource)
	patch := fmt.Sprintf(`{"spec":{"template":{"metadata":{"annotations":{"e2e.dpkit.io/rollout":"%d"}}}}}`, time.Now().UnixNano())
	if _, err := c.AppsV1().DaemonSets(d.namespace).Patch(ctx, d.daemonSet, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Done when the old pod is gone and a new one is ready.
	rollErr := waitRolledOut(ctx, c, d, old.Name)
	seen, lowest := stop()
	if rollErr != nil {
		t.Fatal(rollErr)
	}
	t.Logf("allocatable %s during the rollout: %v", d.resource, seen)
	checkRolloutAllocatable(t, d.resource, seen, lowest)
	waitAllocatable(t, ctx, c, n.Name, d.resource, "2")
	runDevicePod(t, ctx, c, ns, "after", d.resource, "1")
}

// checkRolloutAllocatable judges what allocatable did during a maxSurge
// rollout: never 0 on a v1.37 kubelet. Kubelets v1.34 to v1.36 drop the
// newest instance's client when an older instance exits
// (kubernetes#121994) and so the resource to 0; the SDK registers again at
// once (the caller then waits for the full count to come back).
func checkRolloutAllocatable(t *testing.T, res corev1.ResourceName, seen []string, lowest int64) {
	t.Helper()
	if controlplane.KubeletMinor() < 37 {
		t.Logf("skew: kubelet %s: device plugin rolling update (maxSurge 1): allocatable %v (kubernetes#121994 drops it; the SDK registers again)", controlplane.KubeletVersion(), seen)
		return
	}
	if lowest == 0 {
		t.Errorf("allocatable %s dropped to 0 during the rolling update (values seen: %v)", res, seen)
	}
	t.Logf("skew: kubelet %s: device plugin rolling update (maxSurge 1): allocatable %v, never 0", controlplane.KubeletVersion(), seen)
}

// watchAllocatable follows the node's allocatable of res until the
// returned stop is called, which returns the values seen (each change
// once) and the lowest. A watch the API server ends is opened again.
func watchAllocatable(t *testing.T, ctx context.Context, c kubernetes.Interface, node string, res corev1.ResourceName) (stop func() ([]string, int64)) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	var (
		seen   []string
		lowest = int64(-1)
		done   = make(chan struct{})
	)
	opened := make(chan error, 1)
	go func() {
		defer close(done)
		first := true
		for ctx.Err() == nil {
			w, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
			if first {
				opened <- err
				first = false
			}
			if err != nil {
				return
			}
			for ev := range w.ResultChan() {
				n, ok := ev.Object.(*corev1.Node)
				if !ok || ev.Type != watch.Modified {
					continue
				}
				q := n.Status.Allocatable[res]
				if len(seen) == 0 || seen[len(seen)-1] != q.String() {
					seen = append(seen, q.String())
				}
				if v := q.Value(); lowest < 0 || v < lowest {
					lowest = v
				}
			}
			w.Stop()
		}
	}()
	if err := <-opened; err != nil {
		cancel()
		t.Fatal(err)
	}
	return func() ([]string, int64) {
		cancel()
		<-done
		return seen, lowest
	}
}

func waitRolledOut(ctx context.Context, c kubernetes.Interface, d deployment, oldPod string) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ds, err := c.AppsV1().DaemonSets(d.namespace).Get(ctx, d.daemonSet, metav1.GetOptions{})
		if err != nil {
			return err
		}
		_, err = c.CoreV1().Pods(d.namespace).Get(ctx, oldPod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) && ds.Status.UpdatedNumberScheduled == 1 && ds.Status.NumberReady == 1 && ds.Status.NumberAvailable == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rollout of %s not done: %w; status %+v", d.daemonSet, ctx.Err(), ds.Status)
		case <-tick.C:
		}
	}
}

// TestRealNodeGetPods: `dpkit get pods --root <kubelet root>` reads the
// real kubelet's PodResources API and lists the same pods as the
// apiserver, with the device the pod holds.
func TestRealNodeGetPods(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	d := deployHelm(t, "e2e.dpkit.io/zero-get")
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")
	ns := createNamespace(t, c, "getpods")
	runDevicePod(t, ctx, c, ns, "holder", d.resource, "1")

	var rows []struct {
		Namespace, Name string
		Containers      []struct {
			Name    string
			Devices []struct {
				Resource  string
				DeviceIDs []string
			}
		}
	}
	out := runDpkit(t, ctx, 0, "get", "pods", "--root", n.KubeletRoot, "-o", "json")
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("dpkit get pods -o json: %v\n%s", err, out)
	}
	fromKubelet := map[string]bool{}
	for _, r := range rows {
		fromKubelet[r.Namespace+"/"+r.Name] = true
		if r.Namespace == ns && r.Name == "holder" {
			if len(r.Containers) != 1 || len(r.Containers[0].Devices) != 1 || r.Containers[0].Devices[0].Resource != string(d.resource) || len(r.Containers[0].Devices[0].DeviceIDs) != 1 {
				t.Errorf("holder as dpkit get pods shows it: %+v", r)
			}
		}
	}
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		t.Fatal(err)
	}
	fromAPI := map[string]bool{}
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			fromAPI[p.Namespace+"/"+p.Name] = true
		}
	}
	for k := range fromAPI {
		if !fromKubelet[k] {
			t.Errorf("running pod %s is not in dpkit get pods (%v)", k, keys(fromKubelet))
		}
	}
	if !fromKubelet[ns+"/holder"] {
		t.Errorf("dpkit get pods lacks %s/holder: %s", ns, out)
	}
	var buf bytes.Buffer
	fmt.Fprint(&buf, runDpkit(t, ctx, 0, "get", "pods", "--root", n.KubeletRoot))
	if !strings.Contains(buf.String(), "holder") {
		t.Errorf("dpkit get pods (table) lacks the pod:\n%s", buf.String())
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestRealNodeShippedGenericOverlay deploys deploy/overlays/generic as the
// docs say (its own config, only the image the locally built one): every
// resource of its config whose device nodes the host has is allocatable
// with one ID per device and share (the plugin's container is
// unprivileged; its device cgroup lets it open /dev/net/tun and not
// /dev/fuse, which must not make fuse unhealthy), and a pod asking for
// dpkit.io/fuse gets /dev/fuse.
func TestRealNodeShippedGenericOverlay(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	overlay := filepath.Join("..", "..", "deploy", "overlays", "generic")
	cfg, err := config.LoadPluginConfig(filepath.Join(overlay, "config.yaml"), "config")
	if err != nil {
		t.Fatal(err)
	}
	want := map[corev1.ResourceName]int{}
	for _, p := range cfg.Plugins {
		if p.Generic == nil {
			continue
		}
		for _, g := range p.Generic.Groups {
			devices := 0
			for _, ps := range g.Paths {
				m, err := devfs.Glob("/dev", ps.Path)
				if err != nil {
					t.Fatal(err)
				}
				devices += len(m)
			}
			if devices > 0 && len(g.USB) == 0 && len(g.PCI) == 0 {
				want[corev1.ResourceName(p.Generic.ResourceName(g))] = devices * max(g.Count, 1)
			}
		}
	}
	if len(want) == 0 {
		t.Skip("the host has none of the device nodes the shipped generic config names")
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, must(filepath.Abs(overlay)))
	if err != nil {
		t.Fatal(err)
	}
	name, tag, _ := strings.Cut(pluginImage, ":")
	writeFile(t, filepath.Join(dir, "kustomization.yaml"), "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- "+rel+
		"\nimages:\n- name: "+imagespec.PluginRepository+"\n  newName: "+name+"\n  newTag: "+tag+"\n")
	d := deploymentOf(t, render(t, "kustomize", dir), "")
	d.apply(t, ctx, cp)
	for res, count := range want {
		waitAllocatable(t, ctx, c, n.Name, res, strconv.Itoa(count))
	}
	if _, ok := want["dpkit.io/fuse"]; !ok {
		return
	}
	ns := createNamespace(t, c, "realnode-fuse")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "fuse", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", "ls -l /dev/fuse && head -c 0 /dev/fuse && echo opened"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"dpkit.io/fuse": resource.MustParse("1")}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, ns, pod.Name)
		}
		deletePodAndWait(t, c, ns, pod.Name)
	})
	waitPod(t, ctx, c, ns, pod.Name, "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	b, err := c.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(b), "10, 229") || !strings.Contains(string(b), "opened") {
		t.Errorf("the pod's log %q (%v), want /dev/fuse (10, 229) opened", b, err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
