package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/test/controlplane"
)

// TestExporterOnRealNode runs dpkit exporter against a real kubelet's
// PodResources socket (<kubelet root>/pod-resources/kubelet.sock) while a
// pod holds one of the generic plugin's /dev/zero devices (deployed with
// the Helm chart): the pod's device is in the first scrape after the
// kubelet lists it, with the resource's allocatable and allocated counts;
// its health comes from the pod status the kubelet writes (--kubeconfig);
// the deleted pod is gone from the first scrape after the kubelet stops
// listing it.
func TestExporterOnRealNode(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()
	// The chart renders into dpkit-system and creates no namespace.
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dpkit-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	d := deployHelm(t, "e2e.dpkit.io/zero-exporter")
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")
	ns := createNamespace(t, c, "realnode-exporter")
	runDevicePod(t, ctx, c, ns, "holder", d.resource, "1")
	ids := podDevices(t, ctx, n, ns, "holder")
	if len(ids) != 1 {
		t.Fatalf("the kubelet lists devices %v for the holder, want one", ids)
	}

	addr := startExporter(t, ctx, n.KubeletRoot, "--kubeconfig", cp.Kubeconfig, "--node-name", n.Name)
	out, err := scrapeExporter(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf(`dpkit_pod_device_allocated{claim="",claim_namespace="",container="app",device="",device_id=%q,driver="",namespace=%q,numa_node="",pod="holder",pool="",resource=%q,share=""} 1`, ids[0], ns, d.resource),
		fmt.Sprintf(`dpkit_node_resource_allocatable{resource=%q} 2`, d.resource),
		fmt.Sprintf(`dpkit_node_resource_allocated{resource=%q} 1`, d.resource),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the real kubelet's exporter has no\n%s\n%s", want, grepLines(out, "dpkit_"))
		}
	}
	if controlplane.KubeletMinor() < 36 {
		// Kubelets before v1.36 have ResourceHealthStatus off: the pod
		// status has no allocatedResourcesStatus, so the exporter knows
		// no health for the device and says none (rather than a guess).
		if lines := grepLines(out, "dpkit_pod_device_health{"); strings.Contains(lines, ids[0]) {
			t.Errorf("kubelet %s writes no device health into pod status, yet the exporter says:\n%s", controlplane.KubeletVersion(), lines)
		}
		t.Logf("skew: kubelet %s: exporter: devices and counts; no health from pod status (ResourceHealthStatus off)", controlplane.KubeletVersion())
	} else {
		poll(t, ctx, "the exporter to say "+ids[0]+" Healthy from the pod status", func(ctx context.Context) (bool, string, error) {
			out, err := scrapeExporter(ctx, addr)
			if err != nil {
				return false, err.Error(), nil
			}
			lines := grepLines(out, "dpkit_pod_device_health{")
			return healthValue(lines, ids[0], "Healthy") == "1", lines, nil
		})
		t.Logf("skew: kubelet %s: exporter: devices, counts and health from pod status", controlplane.KubeletVersion())
	}

	if err := c.CoreV1().Pods(ns).Delete(ctx, "holder", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(10))}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the kubelet to stop listing the holder", func(ctx context.Context) (bool, string, error) {
		got := podDevices(t, ctx, n, ns, "holder")
		return len(got) == 0, fmt.Sprint(got), nil
	})
	out, err = scrapeExporter(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `pod="holder"`) || !strings.Contains(out, fmt.Sprintf(`dpkit_node_resource_allocated{resource=%q} 0`, d.resource)) {
		t.Errorf("after the holder was deleted:\n%s", grepLines(out, "dpkit_"))
	}
}
