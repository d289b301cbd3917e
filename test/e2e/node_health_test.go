package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
)

// serveDevices serves plugin for resource to the node under root
// in-process until the test ends or stop is called; stop ends the plugin
// as a kill does as far as the node can tell: its ListAndWatch stream ends
// and it does not register again.
func serveDevices(t *testing.T, root string, res corev1.ResourceName, plugin deviceplugin.Plugin) (stop func()) {
	t.Helper()
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: filepath.Join(root, "device-plugins")}, deviceplugin.Resource{Name: string(res), Plugin: plugin})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("device plugin server: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// podFollower follows one pod through a watch, noting when each update
// arrives.
type podFollower struct {
	t        *testing.T
	ctx      context.Context
	c        kubernetes.Interface
	ns, name string
	w        watch.Interface
	last     *corev1.Pod
}

func followPod(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string) *podFollower {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := &podFollower{t: t, ctx: ctx, c: c, ns: ns, name: name, last: p}
	f.rewatch()
	t.Cleanup(func() { f.w.Stop() })
	return f
}

func (f *podFollower) rewatch() {
	f.t.Helper()
	w, err := f.c.CoreV1().Pods(f.ns).Watch(f.ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", f.name).String(),
		ResourceVersion: f.last.ResourceVersion,
	})
	if err != nil {
		f.t.Fatalf("watch pod %s/%s: %v", f.ns, f.name, err)
	}
	f.w = w
}

// until waits until the pod satisfies cond and returns it with the time
// its update arrived (now if it already did).
func (f *podFollower) until(what string, cond func(*corev1.Pod) bool) (*corev1.Pod, time.Time) {
	f.t.Helper()
	timeout := time.NewTimer(waitTimeout)
	defer timeout.Stop()
	for !cond(f.last) {
		select {
		case ev, ok := <-f.w.ResultChan():
			if !ok {
				f.rewatch()
				continue
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && (ev.Type == watch.Added || ev.Type == watch.Modified) {
				f.last = p
				if cond(p) {
					return p, time.Now()
				}
			}
		case <-timeout.C:
			f.t.Fatalf("pod %s/%s: waiting for %s; last status: phase %s, device health %v", f.ns, f.name, what, f.last.Status.Phase, statusHealth(f.last))
		}
	}
	return f.last, time.Now()
}

// statusHealth flattens the allocatedResourcesStatus of a pod's init and
// app containers to container -> resource/device -> health.
func statusHealth(p *corev1.Pod) map[string]map[string]corev1.ResourceHealthStatus {
	out := map[string]map[string]corev1.ResourceHealthStatus{}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		for _, rs := range cs.AllocatedResourcesStatus {
			if out[cs.Name] == nil {
				out[cs.Name] = map[string]corev1.ResourceHealthStatus{}
			}
			for _, h := range rs.Resources {
				out[cs.Name][string(rs.Name)+"/"+string(h.ResourceID)] = h.Health
			}
		}
	}
	return out
}

// healthIs holds when container reports exactly the devices of want (by
// ID, of example.com/foo) with their health.
func healthIs(container string, want map[string]corev1.ResourceHealthStatus) func(*corev1.Pod) bool {
	return func(p *corev1.Pod) bool {
		got := statusHealth(p)[container]
		if len(got) != len(want) {
			return false
		}
		for id, h := range want {
			if got[string(foo)+"/"+id] != h {
				return false
			}
		}
		return true
	}
}

func each(ids []string, h corev1.ResourceHealthStatus) map[string]corev1.ResourceHealthStatus {
	out := map[string]corev1.ResourceHealthStatus{}
	for _, id := range ids {
		out[id] = h
	}
	return out
}

// TestVirtualNodeDeviceHealth is the must-show flow of device health in
// pod status (KEP-4680) on dpkit node: a pod holding 2 devices shows them
// Healthy in status.containerStatuses[].allocatedResourcesStatus; the
// plugin marks one unhealthy and the pod status says Unhealthy (the time
// from the plugin's change to the watch event is logged; only a generous
// timeout is asserted); "dpkit get pods --kubeconfig" shows it; a pod
// whose init and sidecar containers hold devices gets their health in
// initContainerStatuses (the API server accepts it); the plugin is killed
// and every device reads Unknown; a plugin registering again makes them
// Healthy.
func TestVirtualNodeDeviceHealth(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-health")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)

	ids8 := make([]string, 8)
	for i := range ids8 {
		ids8[i] = fmt.Sprintf("dev-%d", i)
	}
	devs := dptest.NewDevices(ids8...)
	stopPlugin := serveDevices(t, root, foo, devs)
	waitFoo(t, ctx, c, name, 8, 8)

	ns := createNamespace(t, c, "vn-health")
	runUntilRemoved(t, ctx, c, ns, "devices", name, root, "")
	ids := waitPodDevices(t, ctx, root, ns, "devices", 2)
	f := followPod(t, ctx, c, ns, "devices")
	f.until("both devices Healthy", healthIs("app", each(ids, corev1.ResourceHealthStatusHealthy)))

	// Flip one device, and back, a few times; each flip's latency runs
	// from the plugin's change to the pod's watch event.
	var flips []time.Duration
	for range 5 {
		start := time.Now()
		devs.SetHealth(ids[0], false)
		_, at := f.until(ids[0]+" Unhealthy", healthIs("app", map[string]corev1.ResourceHealthStatus{ids[0]: corev1.ResourceHealthStatusUnhealthy, ids[1]: corev1.ResourceHealthStatusHealthy}))
		flips = append(flips, at.Sub(start))
		start = time.Now()
		devs.SetHealth(ids[0], true)
		_, at = f.until(ids[0]+" Healthy again", healthIs("app", each(ids, corev1.ResourceHealthStatusHealthy)))
		flips = append(flips, at.Sub(start))
	}
	t.Logf("device health change to pod status watch event, %d flips: min %v, median %v, max %v", len(flips), minOf(flips), medianOf(flips), maxOf(flips))

	devs.SetHealth(ids[1], false)
	f.until(ids[1]+" Unhealthy", healthIs("app", map[string]corev1.ResourceHealthStatus{ids[0]: corev1.ResourceHealthStatusHealthy, ids[1]: corev1.ResourceHealthStatusUnhealthy}))
	out := runDpkit(t, ctx, 0, "get", "pods", "--root", root, "--kubeconfig", cp.Kubeconfig)
	if want := strings.Join(ids, ",") + "  Healthy,Unhealthy"; !strings.Contains(out, want) {
		t.Errorf("dpkit get pods --kubeconfig:\n%s\nwant %q", out, want)
	}

	// Init and sidecar containers holding devices get their health too.
	always := corev1.ContainerRestartPolicyAlways
	hold := fmt.Sprintf("while [ -e %s ]; do sleep 0.1; done", filepath.Join(root, "hold"))
	one := corev1.ResourceRequirements{Limits: corev1.ResourceList{foo: resource.MustParse("1")}}
	side := devicePod(ns, "sidecar", name, "1", []string{"sh", "-c", hold})
	side.Spec.InitContainers = []corev1.Container{
		{Name: "init", Image: "none", Command: []string{"true"}, Resources: one},
		{Name: "side", Image: "none", Command: []string{"sh", "-c", hold}, RestartPolicy: &always, Resources: one},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, side, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sf := followPod(t, ctx, c, ns, "sidecar")
	sp, _ := sf.until("every container with one Healthy device", func(p *corev1.Pod) bool {
		h := statusHealth(p)
		return p.Status.Phase == corev1.PodRunning && len(h["init"]) == 1 && len(h["side"]) == 1 && len(h["app"]) == 1
	})
	for cn, devices := range statusHealth(sp) {
		for d, h := range devices {
			if h != corev1.ResourceHealthStatusHealthy && d != string(foo)+"/"+ids[1] {
				t.Errorf("sidecar pod: container %s device %s is %s, want Healthy", cn, d, h)
			}
		}
	}

	// The plugin is killed: every held device is Unknown.
	start := time.Now()
	stopPlugin()
	_, at := f.until("both devices Unknown", healthIs("app", each(ids, corev1.ResourceHealthStatusUnknown)))
	t.Logf("plugin stop to Unknown in pod status: %v", at.Sub(start))
	sf.until("the sidecar pod's devices Unknown", func(p *corev1.Pod) bool {
		h := statusHealth(p)
		for _, cn := range []string{"init", "side", "app"} {
			if len(h[cn]) != 1 {
				return false
			}
			for _, v := range h[cn] {
				if v != corev1.ResourceHealthStatusUnknown {
					return false
				}
			}
		}
		return true
	})

	// A plugin registers again: Healthy.
	serveDevices(t, root, foo, dptest.NewDevices(ids8...))
	f.until("both devices Healthy after the plugin came back", healthIs("app", each(ids, corev1.ResourceHealthStatusHealthy)))
}

// waitFoo waits until the node's capacity and allocatable of
// example.com/foo are as given, the entry present.
func waitFoo(t *testing.T, ctx context.Context, c kubernetes.Interface, node string, capacity, allocatable int64) {
	t.Helper()
	poll(t, ctx, fmt.Sprintf("node %s with %d/%d example.com/foo", node, capacity, allocatable), func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		cq, ok1 := n.Status.Capacity[foo]
		aq, ok2 := n.Status.Allocatable[foo]
		return ok1 && ok2 && cq.Value() == capacity && aq.Value() == allocatable,
			fmt.Sprintf("capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable), nil
	})
}

// TestVirtualNodeRemovedResource checks that a device-plugin resource
// whose plugin stayed away for the grace period stays on the Node with
// capacity and allocatable 0, as the kubelet keeps it, also after dpkit
// node restarts, until a plugin registers it again.
func TestVirtualNodeRemovedResource(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-removed")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	o.DeviceGracePeriod = time.Second
	_, stopNode := runNode(t, ctx, o)

	stopPlugin := serveDevices(t, root, foo, dptest.NewDevices("dev-0", "dev-1"))
	waitFoo(t, ctx, c, name, 2, 2)
	stopPlugin()
	waitFoo(t, ctx, c, name, 0, 0)

	// After a restart the entry stays: once the restarted node has
	// reported another plugin's resource, example.com/foo is still there
	// at 0.
	stopNode()
	o.Port = freePort(t)
	runNode(t, ctx, o)
	const bar = corev1.ResourceName("example.com/bar")
	serveDevices(t, root, bar, dptest.NewDevices("b0"))
	poll(t, ctx, "the restarted node to report example.com/bar", func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		q, ok := n.Status.Allocatable[bar]
		return ok && q.Value() == 1, fmt.Sprintf("capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable), nil
	})
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantZero := func(n *corev1.Node) {
		t.Helper()
		for field, l := range map[string]corev1.ResourceList{"capacity": n.Status.Capacity, "allocatable": n.Status.Allocatable} {
			if q, ok := l[foo]; !ok || q.Value() != 0 {
				t.Errorf("after the restart %s[%s] = %v (present %v), want 0", field, foo, q.String(), ok)
			}
		}
	}
	wantZero(n)

	serveDevices(t, root, foo, dptest.NewDevices("dev-0", "dev-1", "dev-2"))
	waitFoo(t, ctx, c, name, 3, 3)
}

// TestVirtualNodePreStart checks PreStartContainer on dpkit node with the
// process backend: a plugin that asks for it gets one call per container
// holding its devices (an init container, then the app container, which
// also reuses the init container's device), each before the container's
// command ran, and the pod runs.
func TestVirtualNodePreStart(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-prestart")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)

	ran := func(container string) string { return filepath.Join(root, "ran-"+container) }
	var mu sync.Mutex
	var calls [][]string
	plugin := dptest.NewDevices("dev-0", "dev-1", "dev-2", "dev-3").PreStarting(func(_ context.Context, ids []string) error {
		// Calls come init (1 device) then app (2).
		container := map[int]string{1: "init", 2: "app"}[len(ids)]
		if _, err := os.Stat(ran(container)); err == nil {
			t.Errorf("PreStartContainer %v after container %s ran", ids, container)
		}
		mu.Lock()
		calls = append(calls, slices.Sorted(slices.Values(ids)))
		mu.Unlock()
		return nil
	})
	serveDevices(t, root, foo, plugin)
	waitFoo(t, ctx, c, name, 4, 4)

	ns := createNamespace(t, c, "vn-prestart")
	pod := devicePod(ns, "prestart", name, "2", []string{"sh", "-c", fmt.Sprintf("touch %s; while [ -e %s ]; do sleep 0.1; done", ran("app"), filepath.Join(root, "hold"))})
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "none", Command: []string{"touch", ran("init")},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{foo: resource.MustParse("1")}}}}
	hold := filepath.Join(root, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(hold) })
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "prestart", "Running", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
	app := waitPodDevices(t, ctx, root, ns, "prestart", 2)
	mu.Lock()
	got := slices.Clone(calls)
	mu.Unlock()
	if len(got) != 2 || len(got[0]) != 1 || !slices.Contains(app, got[0][0]) || !slices.Equal(got[1], app) {
		t.Errorf("PreStartContainer calls %v, want the init container's device (one of the app's %v), then the app's", got, app)
	}
}
