package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/test/controlplane"
)

// skewDevice creates a character device like /dev/zero at /dev/<name> on
// the host (the node's /dev): the generic plugin serves it, and the test
// takes it away to make the device unhealthy.
func skewDevice(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join("/dev", name)
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 5))); err != nil {
		t.Fatalf("mknod %s: %v", path, err)
	}
	t.Cleanup(func() { _ = os.Remove(path) })
	return path
}

// skewGroup is a generic plugin entry serving one device node as
// /dev/dpkit-zero in the container, through fronts.
func skewGroup(res, path, fronts string) string {
	group := "groups:\n- name: " + res + "\n  paths:\n  - path: " + path + "\n    containerPath: /dev/dpkit-zero\n  count: 1\n  env:\n    DPKIT_E2E: from the plugin\n"
	return "- generic:\n" + indent(group, "    ") + "  fronts: [" + fronts + "]\n"
}

// TestRealNodeSkew is the cell of the version-skew matrix that needs a
// device to go bad (make test-skew runs it on kubelets v1.34 to v1.37
// with the control plane at v1.37): the generic plugin in the full image
// serves one device through the device plugin front and another through
// the DRA front; a pod holds each (by extended resource, by claim). Then
// both device nodes are removed from the host: the plugin reports them
// unhealthy, the kubelet drops the device plugin's from allocatable and
// the DRA front taints its device in the ResourceSlice, on every version.
// Kubelets with ResourceHealthStatus on (v1.36 and newer) write both
// devices' health into the pods' status (allocatedResourcesStatus,
// Unhealthy); older ones write none, and the test checks that too.
func TestRealNodeSkew(t *testing.T) {
	cp, n := realNode.Get(t)
	importFullImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	version := controlplane.KubeletVersion()
	u := strings.ReplaceAll(unique("skew"), ".", "-")
	dpRes, draRes := "e2e.dpkit.io/skew-dp", "e2e.dpkit.io/skew-dra"
	dpPath, draPath := skewDevice(t, "dpkit-"+u+"-dp"), skewDevice(t, "dpkit-"+u+"-dra")
	config := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\ndra:\n  kubeconfig: /etc/dpkit-kube/kubeconfig\nplugins:\n" +
		skewGroup(dpRes, dpPath, "deviceplugin") + skewGroup(draRes, draPath, "dra")
	d, dir := deployFullImage(t, ctx, cp, n, config, dpRes)
	driver := resourcename.DriverName(draRes)
	poll(t, ctx, "DaemonSet "+d.daemonSet+" ready, the DRA front's slice published", func(ctx context.Context) (bool, string, error) {
		ds, err := c.AppsV1().DaemonSets(d.namespace).Get(ctx, d.daemonSet, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		names, err := sliceDevices(ctx, c, n.Name, driver)
		return ds.Status.NumberReady == 1 && len(names) == 1, fmt.Sprintf("ready %d, slice devices %v", ds.Status.NumberReady, names), err
	})
	class := applyDeviceClasses(t, ctx, c, "--config", filepath.Join(dir, "plugin.yaml"))
	if len(class) != 1 {
		t.Fatalf("DeviceClasses %v, want the DRA resource's", class)
	}
	ns := createNamespace(t, c, "skew")
	runDevicePod(t, ctx, c, ns, "dp", corev1.ResourceName(dpRes), "1")
	t.Logf("skew: kubelet %s: device plugin front: pod running with its device", version)
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "dev", class[0], 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claimPod := zeroPod(ns, "claim", corev1.ResourceName(draRes), "1")
	claimPod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}
	claimPod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimName: ptr("dev")}}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, ns, "claim")
		}
		deletePodAndWait(t, c, ns, "claim")
	})
	waitPod(t, ctx, c, ns, "claim", "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	wantDeviceLogs(t, ctx, c, ns, "claim")
	t.Logf("skew: kubelet %s: DRA front: claim prepared, pod running with its device", version)

	for _, p := range []string{dpPath, draPath} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, ctx, "the kubelet to drop the unhealthy device plugin device from allocatable", func(ctx context.Context) (bool, string, error) {
		node, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		q := node.Status.Allocatable[corev1.ResourceName(dpRes)]
		return q.IsZero(), "allocatable " + q.String(), nil
	})
	poll(t, ctx, "the DRA front to taint its unhealthy device", func(ctx context.Context) (bool, string, error) {
		slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		for _, s := range slices.Items {
			if s.Spec.Driver == driver && s.Spec.NodeName != nil && *s.Spec.NodeName == n.Name {
				for _, dev := range s.Spec.Devices {
					if len(dev.Taints) > 0 {
						return true, "", nil
					}
				}
			}
		}
		return false, "no taint yet", nil
	})
	health := func(name string) map[string]corev1.ResourceHealthStatus {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]corev1.ResourceHealthStatus{}
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, h := range rs.Resources {
					out[string(rs.Name)+"/"+string(h.ResourceID)] = h.Health
				}
			}
		}
		return out
	}
	if controlplane.KubeletMinor() < 36 {
		for _, p := range []string{"dp", "claim"} {
			if h := health(p); len(h) > 0 {
				t.Errorf("kubelet %s has ResourceHealthStatus off, yet pod %s has allocatedResourcesStatus %v", version, p, h)
			}
		}
		t.Logf("skew: kubelet %s: health in pod status: none (ResourceHealthStatus off); allocatable and the slice's taint follow the device", version)
		return
	}
	for _, p := range []string{"dp", "claim"} {
		poll(t, ctx, "pod "+p+"'s status to say its device is Unhealthy", func(context.Context) (bool, string, error) {
			h := health(p)
			for _, v := range h {
				if v == corev1.ResourceHealthStatusUnhealthy {
					return true, "", nil
				}
			}
			return false, fmt.Sprint(h), nil
		})
	}
	t.Logf("skew: kubelet %s: health in pod status: Unhealthy for both fronts' devices", version)
}
