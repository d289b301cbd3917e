package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// TestExporterDRAOnVirtualNode runs two dpkit exporters on a dpkit node
// where a pod holds a ResourceClaim's device of the fake DRA driver (the
// upstream kubeletplugin helper): one reads health from the pod status
// (--kubeconfig, in dpkit-cluster), the other from the driver's health
// stream with no API server (--dra-plugins-dir). The claim's device is in
// both exporters' first scrape after PodResources lists it, with its
// claim namespace, claim, driver, pool and device; the driver turning it
// Unhealthy shows in both health gauges; the deleted pod is gone from the
// first scrape after PodResources stops listing it.
func TestExporterDRAOnVirtualNode(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-exporter-dra")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	drv := startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "dev-0", "dev-1")
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "vn-exporter-dra")
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "one", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hold := filepath.Join(root, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(hold) })
	if _, err := c.CoreV1().Pods(ns).Create(ctx, claimPod(ns, "dra", name, "one", []string{"sh", "-c", fmt.Sprintf("while [ -e %s ]; do sleep 0.1; done", hold)}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	withAPI := startExporter(t, ctx, root, "--kubeconfig", cp.Kubeconfig, "--node-name", name)
	noAPI := startExporter(t, ctx, root, "--dra-plugins-dir", filepath.Join(root, "plugins"))
	exporters := map[string]string{"--kubeconfig": withAPI, "--dra-plugins-dir": noAPI}

	res := waitPodClaims(t, ctx, root, ns, "dra", 1)
	if m, _ := drv.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("driver call %s, want NodePrepareResources", m)
	}
	dev := res[0]
	if dev.DriverName != dratest.DriverName || dev.PoolName != name {
		t.Fatalf("PodResources lists %v, want a device of %s in pool %s", dev, dratest.DriverName, name)
	}
	id := dratest.DriverName + "/" + name + "/" + dev.DeviceName
	series := fmt.Sprintf(`dpkit_pod_device_allocated{claim="one",claim_namespace=%q,container="app",device=%q,device_id=%q,driver=%q,namespace=%q,numa_node="",pod="dra",pool=%q,resource="",share=""} 1`,
		ns, dev.DeviceName, id, dratest.DriverName, ns, name)
	for flag, addr := range exporters {
		out, err := scrapeExporter(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, series) {
			t.Errorf("exporter with %s: the first scrape after PodResources lists the claim has no\n%s\n%s", flag, series, grepLines(out, "dpkit_pod_device_allocated"))
		}
		if want := fmt.Sprintf(`dpkit_node_dra_devices_allocated{driver=%q,pool=%q} 1`, dratest.DriverName, name); !strings.Contains(out, want) {
			t.Errorf("exporter with %s: no %s\n%s", flag, want, grepLines(out, "dpkit_node_dra"))
		}
	}

	healthIn := func(flag, state string) {
		t.Helper()
		poll(t, ctx, "the exporter with "+flag+" to say "+id+" "+state, func(ctx context.Context) (bool, string, error) {
			out, err := scrapeExporter(ctx, exporters[flag])
			if err != nil {
				return false, err.Error(), nil
			}
			lines := grepLines(out, "dpkit_pod_device_health{")
			return healthValue(lines, id, state) == "1", lines, nil
		})
	}
	for flag := range exporters {
		healthIn(flag, "Healthy")
	}

	// The driver says the device is unhealthy: the kubelet's pod status
	// and the driver's stream both carry it to the exporters.
	f := followPod(t, ctx, c, ns, "dra")
	drv.Send(t, "health "+dev.DeviceName+" Unhealthy the test broke it")
	cdi := dratest.CDIDeviceID(dev.DeviceName)
	f.until(cdi+" Unhealthy in the pod status", func(p *corev1.Pod) bool {
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				for _, h := range rs.Resources {
					if string(h.ResourceID) == cdi && h.Health == corev1.ResourceHealthStatusUnhealthy {
						return true
					}
				}
			}
		}
		return false
	})
	for flag := range exporters {
		healthIn(flag, "Unhealthy")
	}

	// The pod is deleted: gone from the first scrape after PodResources
	// stops listing it.
	if err := c.CoreV1().Pods(ns).Delete(ctx, "dra", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	waitPodClaims(t, ctx, root, ns, "dra", 0)
	for flag, addr := range exporters {
		out, err := scrapeExporter(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, `pod="dra"`) || strings.Contains(out, "dpkit_node_dra_devices_allocated{") {
			t.Errorf("exporter with %s, after the pod was deleted:\n%s", flag, grepLines(out, "dpkit_"))
		}
	}
}

// waitPodClaims waits until PodResources lists n claim devices of pod and
// returns them.
func waitPodClaims(t *testing.T, ctx context.Context, root, ns, pod string, n int) []*podresourcesv1.ClaimResource {
	t.Helper()
	var got []*podresourcesv1.ClaimResource
	poll(t, ctx, fmt.Sprintf("PodResources to list %d claim devices of %s/%s", n, ns, pod), func(ctx context.Context) (bool, string, error) {
		prc, closer, err := prclient.Dial(ctx, podresources.SocketPath(root))
		if err != nil {
			return false, err.Error(), nil
		}
		defer closer.Close()
		resp, err := prc.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			return false, err.Error(), nil
		}
		got = nil
		for _, p := range resp.PodResources {
			if p.Namespace != ns || p.Name != pod {
				continue
			}
			for _, ctr := range p.Containers {
				for _, dr := range ctr.DynamicResources {
					got = append(got, dr.ClaimResources...)
				}
			}
		}
		return len(got) == n, fmt.Sprintf("%v", resp.PodResources), nil
	})
	return got
}
