package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/podresources"
)

// TestExporterOnVirtualNode runs dpkit exporter (handed over to
// dpkit-cluster by --kubeconfig) on a dpkit node's PodResources socket:
// pods holding a device plugin's devices appear in /metrics with their
// namespace, pod, container, resource, device IDs and the pod label asked
// for, in the first scrape after PodResources lists them; a device
// turning unhealthy shows in dpkit_pod_device_health once the pod status
// has it; a deleted pod is gone from the first scrape after PodResources
// stops listing it.
func TestExporterOnVirtualNode(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-exporter")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	devs := dptest.NewDevices("dev-0", "dev-1", "dev-2", "dev-3")
	serveDevices(t, root, foo, devs)
	waitFoo(t, ctx, c, name, 4, 4)

	ns := createNamespace(t, c, "vn-exporter")
	hold := filepath.Join(root, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(hold) })
	for _, pod := range []string{"a", "b"} {
		p := devicePod(ns, pod, name, "2", []string{"sh", "-c", fmt.Sprintf("while [ -e %s ]; do sleep 0.1; done", hold)})
		p.Labels = map[string]string{"app.kubernetes.io/name": "train-" + pod}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	addr := startExporter(t, ctx, root, "--kubeconfig", cp.Kubeconfig, "--node-name", name, "--pod-label", "app.kubernetes.io/name")
	scrape := func(ctx context.Context) (string, error) { return scrapeExporter(ctx, addr) }

	ids := map[string][]string{}
	for _, pod := range []string{"a", "b"} {
		ids[pod] = waitPodDevices(t, ctx, root, ns, pod, 2)
	}
	out, err := scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	device := func(pod, id string) string {
		return fmt.Sprintf(`dpkit_pod_device_allocated{claim="",claim_namespace="",container="app",device="",device_id=%q,driver="",label_app_kubernetes_io_name="train-%s",namespace=%q,numa_node="",pod=%q,pool="",resource="%s",share=""} 1`, id, pod, ns, pod, foo)
	}
	for pod, devices := range ids {
		for _, id := range devices {
			if !strings.Contains(out, device(pod, id)) {
				t.Errorf("the first scrape after PodResources lists %s/%s has no\n%s\n%s", ns, pod, device(pod, id), grepLines(out, "dpkit_pod_device_allocated"))
			}
		}
	}
	if !strings.Contains(out, fmt.Sprintf(`dpkit_node_resource_allocatable{resource="%s"} 4`, foo)) ||
		!strings.Contains(out, fmt.Sprintf(`dpkit_node_resource_allocated{resource="%s"} 4`, foo)) {
		t.Errorf("allocatable/allocated:\n%s", grepLines(out, "dpkit_node_resource"))
	}

	// A device turns unhealthy: once the pod status says so, so does the
	// exporter's next scrape.
	bad := ids["a"][0]
	f := followPod(t, ctx, c, ns, "a")
	devs.SetHealth(bad, false)
	f.until(bad+" Unhealthy", healthIs("app", map[string]corev1.ResourceHealthStatus{bad: corev1.ResourceHealthStatusUnhealthy, ids["a"][1]: corev1.ResourceHealthStatusHealthy}))
	var last string
	poll(t, ctx, "the exporter's informer to see "+bad+" Unhealthy", func(ctx context.Context) (bool, string, error) {
		out, err := scrape(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		last = grepLines(out, "dpkit_pod_device_health{")
		return strings.Contains(last, fmt.Sprintf(`device_id=%q,driver="",health="Unhealthy",label_app_kubernetes_io_name="train-a"`, bad)) &&
			healthValue(last, bad, "Unhealthy") == "1", last, nil
	})

	// Pod b is deleted: gone from the first scrape after PodResources
	// stops listing it.
	if err := c.CoreV1().Pods(ns).Delete(ctx, "b", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	waitPodDevices(t, ctx, root, ns, "b", 0)
	out, err = scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, `pod="b"`) || !strings.Contains(out, device("a", ids["a"][1])) {
		t.Errorf("after pod b was deleted:\n%s", grepLines(out, "dpkit_pod_device"))
	}
}

// startExporter runs dpkit exporter on the PodResources socket of the
// kubelet (or dpkit node) rooted at root, with args, reading PodResources
// on every scrape; it returns its address once it serves a successful
// read.
func startExporter(t *testing.T, ctx context.Context, root string, args ...string) string {
	t.Helper()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	args = append([]string{"exporter", "--pod-resources-socket", podresources.SocketPath(root), "--listen", addr, "--cache-ttl", "1ms", "--sysfs-root", ""}, args...)
	startProc(t, filepath.Join(t.TempDir(), "exporter.log"), os.Environ(), dpkitBinary(t), args...)
	poll(t, ctx, "the exporter to serve", func(ctx context.Context) (bool, string, error) {
		out, err := scrapeExporter(ctx, addr)
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.Contains(out, "dpkit_exporter_podresources_up 1"), out, nil
	})
	return addr
}

// scrapeExporter returns the exporter's /metrics.
func scrapeExporter(ctx context.Context, addr string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func grepLines(s, prefix string) string {
	var out []string
	for l := range strings.Lines(s) {
		if strings.HasPrefix(l, prefix) {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// healthValue is the value of the health series of device id in state.
func healthValue(lines, id, state string) string {
	for l := range strings.Lines(lines) {
		if strings.Contains(l, fmt.Sprintf("device_id=%q,", id)) && strings.Contains(l, fmt.Sprintf("health=%q", state)) {
			f := strings.Fields(l)
			return f[len(f)-1]
		}
	}
	return ""
}
