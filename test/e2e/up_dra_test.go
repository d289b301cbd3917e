package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/resourcename"
)

// startUp runs the built dpkit binary as "dpkit up" with args and returns
// once it printed its ready line; the test's cleanup kills it.
func startUp(t *testing.T, ctx context.Context, args ...string) {
	t.Helper()
	up := exec.CommandContext(ctx, dpkitBinary(t), append([]string{"up"}, args...)...)
	up.Dir = filepath.Join("..", "..")
	up.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir())
	stdout, err := up.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	up.Stderr = &logs
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		found := false
		for sc.Scan() {
			if !found && strings.HasPrefix(sc.Text(), "ready:") {
				found = true
				ready <- true
			}
		}
		if !found {
			ready <- false
		}
	}()
	t.Cleanup(func() {
		_ = up.Process.Kill()
		_ = up.Wait()
		if t.Failed() {
			t.Logf("dpkit up logs:\n%s", logs.String())
		}
	})
	select {
	case ok := <-ready:
		if !ok {
			t.Fatalf("dpkit up %v ended before its ready line:\n%s", args, logs.String())
		}
	case <-ctx.Done():
		t.Fatalf("dpkit up %v printed no ready line: %v", args, ctx.Err())
	}
}

// dpkitRun runs the built dpkit binary with args; it returns stdout,
// stderr and the exit code.
func dpkitRun(t *testing.T, ctx context.Context, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, dpkitBinary(t), args...)
	cmd.Env = append(os.Environ(), "XDG_STATE_HOME="+t.TempDir())
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("dpkit %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// allocate writes claim's status as kube-scheduler would: the devices of
// the fake driver's pool on node, reserved for the pod (none when podUID
// is empty).
func allocate(t *testing.T, ctx context.Context, c kubernetes.Interface, claim *resourcev1.ResourceClaim, node, podName string, podUID types.UID, devices ...string) *resourcev1.ResourceClaim {
	t.Helper()
	claim = claim.DeepCopy()
	alloc := &resourcev1.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	for _, d := range devices {
		alloc.Devices.Results = append(alloc.Devices.Results, resourcev1.DeviceRequestAllocationResult{Request: "req", Driver: dratest.DriverName, Pool: node, Device: d})
	}
	claim.Status.Allocation = alloc
	if podUID != "" {
		claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: podName, UID: podUID}}
	}
	out, err := c.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUpDRAKubeconfig: "dpkit up --kubeconfig" (handed to dpkit-cluster)
// reads claims from the API server. With the fake DRA driver registered
// in its root, "dpkit admit" of a pod whose claim is allocated and
// reserved for it (the claim's status written as the scheduler would)
// prepares the claim through the driver and prints the container's CDI
// devices; "dpkit get claims" shows it prepared. With no scheduler
// running, a claim not allocated is allocated by dpkit admit with the
// scheduler's allocator, reserved and prepared; one no free device
// satisfies refuses its pod with the allocator's reason; "dpkit delete"
// unprepares, unreserves and deallocates.
func TestUpDRAKubeconfig(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	node := unique("up-dra")
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	startUp(t, ctx, "--root", root, "--kubeconfig", cp.Kubeconfig, "--node-name", node)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, node, root, "dev-0", "dev-1", "dev-2")
	poll(t, ctx, "the DRA driver registered with dpkit up", func(ctx context.Context) (bool, string, error) {
		out, errOut, code := dpkitRun(t, ctx, "", "get", "plugins", "--root", root, "-o", "json")
		return code == 0 && strings.Contains(out, `"name": "`+dratest.DriverName+`"`), out + errOut, nil
	})
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "up-dra")

	claim, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "two", class, 2), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podUID := types.UID(unique("uid-train"))
	allocate(t, ctx, c, claim, node, "train", podUID, "dev-0", "dev-1")
	manifest := fmt.Sprintf(`metadata: {name: train, namespace: %s, uid: %s}
spec:
  resourceClaims: [{name: devices, resourceClaimName: two}]
  containers: [{name: app, resources: {claims: [{name: devices}]}}]
`, ns, podUID)
	out, errOut, code := dpkitRun(t, ctx, manifest, "admit", "--root", root, "-f", "-")
	if code != 0 {
		t.Fatalf("dpkit admit: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"claim two: fake.dpkit.io/" + node + "/dev-0,fake.dpkit.io/" + node + "/dev-1",
		"cdi " + dratest.CDIDeviceID("dev-0"), "cdi " + dratest.CDIDeviceID("dev-1")} {
		if !strings.Contains(out, want) {
			t.Errorf("dpkit admit printed\n%s\nwithout %q", out, want)
		}
	}
	if m, uids := drv.NextCall(t); m != "NodePrepareResources" || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Fatalf("driver call %s %v, want NodePrepareResources [%s]", m, uids, claim.UID)
	}

	out, errOut, code = dpkitRun(t, ctx, "", "get", "claims", "-n", ns, "--root", root, "--kubeconfig", cp.Kubeconfig, "-o", "json")
	var claims []struct {
		Name, State, Node string
		ReservedFor       []string
	}
	if code != 0 || json.Unmarshal([]byte(out), &claims) != nil || len(claims) != 1 || claims[0].State != "prepared" || claims[0].Node != node {
		t.Errorf("dpkit get claims --kubeconfig --root: exit %d\n%s%s\nwant claim two prepared on %s", code, out, errOut, node)
	}

	// Not allocated, and no scheduler runs: dpkit admit allocates the
	// claim with the scheduler's allocator from the driver's slice (dev-2
	// is the one device left), reserves it for the pod and prepares it.
	other, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "other", class, 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	late := strings.NewReplacer("name: train", "name: late", string(podUID), "uid-late", "resourceClaimName: two", "resourceClaimName: other").Replace(manifest)
	out, errOut, code = dpkitRun(t, ctx, late, "admit", "--root", root, "-f", "-")
	if code != 0 || !strings.Contains(out, "claim other: fake.dpkit.io/"+node+"/dev-2") || !strings.Contains(out, "cdi "+dratest.CDIDeviceID("dev-2")) {
		t.Fatalf("dpkit admit of a pod whose claim is not allocated: exit %d\n%s%s\nwant claim other allocated dev-2 and prepared", code, out, errOut)
	}
	if m, uids := drv.NextCall(t); m != "NodePrepareResources" || !slices.Equal(uids, []string{string(other.UID)}) {
		t.Fatalf("driver call %s %v, want NodePrepareResources [%s]", m, uids, other.UID)
	}
	got, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Allocation == nil || len(got.Status.ReservedFor) != 1 || got.Status.ReservedFor[0].UID != "uid-late" || !slices.Contains(got.Finalizers, "resource.kubernetes.io/delete-protection") {
		t.Fatalf("claim other after dpkit admit: %+v, finalizers %v; want allocated, reserved for pod late, protected", got.Status, got.Finalizers)
	}

	// Nothing left for a third claim: refused with the allocator's
	// reason, the claim untouched, nothing prepared.
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "third", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	extra := strings.NewReplacer("name: train", "name: extra", string(podUID), "uid-extra", "resourceClaimName: two", "resourceClaimName: third").Replace(manifest)
	_, errOut, code = dpkitRun(t, ctx, extra, "admit", "--root", root, "-f", "-")
	if code != 1 || !strings.Contains(errOut, "ResourceClaim "+ns+"/third") || !strings.Contains(errOut, "cannot allocate all claims") || !strings.Contains(errOut, "allocated to another claim") {
		t.Errorf("dpkit admit of a pod whose claim no free device satisfies: exit %d\n%s\nwant exit 1 with the allocator's reason", code, errOut)
	}
	if got, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "third", metav1.GetOptions{}); err != nil || got.Status.Allocation != nil || len(got.Status.ReservedFor) != 0 {
		t.Errorf("claim third after a refused admission: %v %+v, want untouched", err, got)
	}

	// Deleting the pod unprepares the claim and gives it back: reserved
	// for no pod, it is deallocated (as the resourceclaim controller does).
	if out, errOut, code := dpkitRun(t, ctx, "", "delete", "pod", "late", "-n", ns, "--root", root); code != 0 {
		t.Fatalf("dpkit delete: exit %d\n%s%s", code, out, errOut)
	}
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !slices.Equal(uids, []string{string(other.UID)}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [%s]", m, uids, other.UID)
	}
	if got, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "other", metav1.GetOptions{}); err != nil || got.Status.Allocation != nil || len(got.Status.ReservedFor) != 0 || len(got.Finalizers) != 0 {
		t.Fatalf("claim other after dpkit delete: %v %+v %v, want deallocated, unreserved, no finalizer", err, got.Status, got.Finalizers)
	}

	if out, errOut, code := dpkitRun(t, ctx, "", "delete", "pod", "train", "-n", ns, "--root", root); code != 0 {
		t.Fatalf("dpkit delete: exit %d\n%s%s", code, out, errOut)
	}
	if m, uids := drv.NextCall(t); m != "NodeUnprepareResources" || !slices.Equal(uids, []string{string(claim.UID)}) {
		t.Fatalf("driver call %s %v, want NodeUnprepareResources [%s]", m, uids, claim.UID)
	}
	drv.NoMoreCalls(t)
}

// TestUpDRAFront: "dpkit up --config" of a plugin whose fronts include
// dra, with --kubeconfig, serves the DRA front in the same process as the
// emulated kubelet: the driver registers with it, publishes a
// ResourceSlice for --node-name, and "dpkit admit" of a pod whose claim
// asks the driver's class gets the claim allocated from that slice and
// prepared into a CDI spec under the root, while a pod asking the
// resource by name gets a device through the device plugin front, never
// the claim's. Without --kubeconfig the config is refused, naming the
// field and the flag.
func TestUpDRAFront(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	dir := t.TempDir()
	config := filepath.Join(dir, "both.yaml")
	resource := unique("front") + ".example.com/dev"
	driver := resourcename.DriverName(resource)
	writeFakeConfig(t, config, resource, 2, "deviceplugin, dra")

	_, errOut, code := dpkitRun(t, ctx, "", "up", "--config", config)
	if code != 2 || !strings.Contains(errOut, "plugins[0].fronts") || !strings.Contains(errOut, "--kubeconfig") {
		t.Errorf("dpkit up of a DRA front without --kubeconfig: exit %d\n%s\nwant exit 2 naming plugins[0].fronts and --kubeconfig", code, errOut)
	}

	root := testdir.Short(t, "vn")
	node := unique("up-front")
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	startUp(t, ctx, "--config", config, "--root", root, "--kubeconfig", cp.Kubeconfig, "--node-name", node)
	poll(t, ctx, "the DRA front's ResourceSlice", func(ctx context.Context) (bool, string, error) {
		sl, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + node})
		if err != nil {
			return false, "", err
		}
		return len(sl.Items) == 1 && sl.Items[0].Spec.Driver == driver && len(sl.Items[0].Spec.Devices) == 2, fmt.Sprint(sl.Items), nil
	})
	class := unique("up-front")
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: class},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driver)},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.ResourceV1().DeviceClasses().Delete(context.Background(), class, metav1.DeleteOptions{}) })
	ns := createNamespace(t, c, "up-front")
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "one", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	manifest := fmt.Sprintf(`metadata: {name: claimed, namespace: %s, uid: uid-claimed}
spec:
  resourceClaims: [{name: devices, resourceClaimName: one}]
  containers: [{name: app, resources: {claims: [{name: devices}]}}]
`, ns)
	out, errOut, code := dpkitRun(t, ctx, manifest, "admit", "--root", root, "-f", "-")
	if code != 0 || !strings.Contains(out, "claim one: "+driver+"/"+node+"/") || !strings.Contains(out, "cdi "+driver+"/claim=") {
		t.Fatalf("dpkit admit of a pod with a claim: exit %d\n%s%s\nwant the claim allocated from %s's slice and a CDI device", code, out, errOut, driver)
	}
	specs, err := filepath.Glob(filepath.Join(root, "cdi", "*"))
	if err != nil || len(specs) == 0 {
		t.Errorf("CDI specs under %s/cdi: %v (%v); want the claim's", root, specs, err)
	}
	claim, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "one", metav1.GetOptions{})
	if err != nil || claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim one: %v %+v; want allocated", err, claim)
	}
	held := claim.Status.Allocation.Devices.Results[0].Device

	// The other device goes through the device plugin front; the one the
	// claim holds is withdrawn from it.
	dp := fmt.Sprintf(`metadata: {name: counted, namespace: %s, uid: uid-counted}
spec:
  containers: [{name: app, resources: {limits: {%s: 1}}}]
`, ns, resource)
	out, errOut, code = dpkitRun(t, ctx, dp, "admit", "--root", root, "-f", "-")
	if code != 0 || !strings.Contains(out, resource+": ") {
		t.Fatalf("dpkit admit of a pod asking %s: exit %d\n%s%s", resource, code, out, errOut)
	}
	if strings.Contains(out, held) {
		t.Errorf("the device plugin front gave %s, which claim one holds:\n%s", held, out)
	}

	// A DRA front alone: ready once the driver registered with the
	// emulated kubelet (there is no device plugin to wait for).
	only := filepath.Join(dir, "dra-only.yaml")
	writeFakeConfig(t, only, resource, 1, "dra")
	node2 := unique("up-front-only")
	if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node2}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().Nodes().Delete(context.Background(), node2, metav1.DeleteOptions{}) })
	startUp(t, ctx, "--config", only, "--root", testdir.Short(t, "vn"), "--kubeconfig", cp.Kubeconfig, "--node-name", node2)
	poll(t, ctx, "the DRA-only front's ResourceSlice", func(ctx context.Context) (bool, string, error) {
		sl, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + node2})
		if err != nil {
			return false, "", err
		}
		return len(sl.Items) == 1 && len(sl.Items[0].Spec.Devices) == 1, fmt.Sprint(sl.Items), nil
	})
}

// writeFakeConfig writes a PluginConfig of the fake plugin serving count
// devices of resource through fronts (e.g. "deviceplugin, dra").
func writeFakeConfig(t *testing.T, path, resource string, count int, fronts string) {
	t.Helper()
	config := fmt.Sprintf(`apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resources:
    - name: %s
      count: %d
  fronts: [%s]
`, resource, count, fronts)
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
}
