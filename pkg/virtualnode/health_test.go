package virtualnode

import (
	"context"
	"path/filepath"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// servePlugins serves resources to the device manager under root until the
// test ends or stop is called.
func servePlugins(t *testing.T, root string, resources ...deviceplugin.Resource) (stop func()) {
	t.Helper()
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: filepath.Join(root, "device-plugins")}, resources...)
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

// waitManager waits until cond holds, re-checking on every device manager
// notification.
func waitManager(t *testing.T, m *devicemanager.Manager, what string, cond func() bool) {
	t.Helper()
	ch, cancel := m.Subscribe()
	defer cancel()
	timeout := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("timed out waiting for %s: %+v", what, m.Resources())
		}
	}
}

func allocatableIs(m *devicemanager.Manager, want map[string]int64) func() bool {
	return func() bool {
		_, a := m.Capacity()
		for k, v := range want {
			if a[k] != v {
				return false
			}
		}
		return true
	}
}

// statuses records the last pod state the provider handed to the pod
// controller, by pod name.
type statuses struct {
	mu      sync.Mutex
	last    map[string]*corev1.Pod
	changed chan struct{} // closed and replaced on every report
}

func recordStatuses(ctx context.Context, p *provider) *statuses {
	s := &statuses{last: map[string]*corev1.Pod{}, changed: make(chan struct{})}
	p.NotifyPods(ctx, func(pod *corev1.Pod) {
		s.mu.Lock()
		s.last[pod.Name] = pod.DeepCopy()
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
	})
	return s
}

// wait waits until the last report of pod name satisfies cond, and
// returns it.
func (s *statuses) wait(t *testing.T, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		pod, changed := s.last[name], s.changed
		s.mu.Unlock()
		if pod != nil && cond(pod) {
			return pod
		}
		select {
		case <-changed:
		case <-timeout:
			if pod == nil {
				t.Fatalf("waiting for %s: pod %s never reported", what, name)
			}
			t.Fatalf("waiting for %s: last report: phase %s, device health %v", what, pod.Status.Phase, deviceHealth(pod))
		}
	}
}

// deviceHealth flattens the allocatedResourcesStatus of every container
// status (init containers included) to container -> resource/device ->
// health.
func deviceHealth(pod *corev1.Pod) map[string]map[string]corev1.ResourceHealthStatus {
	out := map[string]map[string]corev1.ResourceHealthStatus{}
	for _, cs := range append(append([]corev1.ContainerStatus(nil), pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
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

// heldHealth is the deviceHealth a pod holding the devices of alloc should
// show when every device has health h except those in except.
func heldHealth(alloc *devicemanager.PodAllocation, h corev1.ResourceHealthStatus, except map[string]corev1.ResourceHealthStatus) map[string]map[string]corev1.ResourceHealthStatus {
	out := map[string]map[string]corev1.ResourceHealthStatus{}
	for _, c := range alloc.Containers {
		out[c.Name] = map[string]corev1.ResourceHealthStatus{}
		for _, r := range c.Resources {
			for _, id := range r.DeviceIDs {
				k := r.Resource + "/" + id
				out[c.Name][k] = h
				if e, ok := except[k]; ok {
					out[c.Name][k] = e
				}
			}
		}
	}
	return out
}

func limits(kv ...any) corev1.ResourceRequirements {
	rl := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		rl[corev1.ResourceName(kv[i].(string))] = *resource.NewQuantity(int64(kv[i+1].(int)), resource.DecimalSI)
	}
	return corev1.ResourceRequirements{Limits: rl, Requests: rl}
}

// TestPodStatusDeviceHealth checks KEP-4680 on the node: the pod status
// names each held device with its health in allocatedResourcesStatus, for
// app, init and sidecar containers; a device turning unhealthy is reported
// again at once, without any change from the backend; the plugin going
// away makes its devices Unknown; and the pod's terminal status keeps the
// last health after its devices are freed.
func TestPodStatusDeviceHealth(t *testing.T) {
	root := testdir.Short(t, "vnp")
	ctx, host, p := startProvider(t, root)
	p.be = sim.New(sim.Config{Config: backend.Config{Notify: p.backendNotify, PreStart: p.preStart}})
	got := recordStatuses(ctx, p)
	t.Cleanup(p.startHealth(ctx, nil))
	const foo = "example.com/foo"
	devs := dptest.NewDevices("d0", "d1", "d2", "d3", "d4", "d5")
	stopPlugin := servePlugins(t, root, deviceplugin.Resource{Name: foo, Plugin: devs})
	waitManager(t, host.Manager, "6 devices", allocatableIs(host.Manager, map[string]int64{foo: 6}))

	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "health", Namespace: "ns", UID: "uid-health"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{
				{Name: "init", Resources: limits(foo, 1)},
				{Name: "side", RestartPolicy: &always, Resources: limits(foo, 1)},
			},
			Containers: []corev1.Container{{Name: "app", Resources: limits(foo, 2)}, {Name: "none"}},
		},
	}
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	alloc := host.Manager.PodAllocation(pod.UID)
	if alloc == nil || len(alloc.Containers) != 3 {
		t.Fatalf("allocation %+v, want devices for init, side and app", alloc)
	}
	healthIs := func(want map[string]map[string]corev1.ResourceHealthStatus) func(*corev1.Pod) bool {
		return func(p *corev1.Pod) bool { return reflect.DeepEqual(deviceHealth(p), want) }
	}
	running := got.wait(t, "health", "every held device Healthy, init and sidecar containers included",
		healthIs(heldHealth(alloc, corev1.ResourceHealthStatusHealthy, nil)))
	if running.Status.Phase != corev1.PodRunning {
		t.Fatalf("phase %s, want Running", running.Status.Phase)
	}
	for _, cs := range running.Status.ContainerStatuses {
		if cs.Name == "none" && cs.AllocatedResourcesStatus != nil {
			t.Errorf("container without devices has allocatedResourcesStatus %v", cs.AllocatedResourcesStatus)
		}
	}

	app0 := alloc.Containers[0].Resources[0].DeviceIDs[0] // containers sorted: app, init, side
	devs.SetHealth(app0, false)
	got.wait(t, "health", app0+" Unhealthy", healthIs(heldHealth(alloc, corev1.ResourceHealthStatusHealthy,
		map[string]corev1.ResourceHealthStatus{foo + "/" + app0: corev1.ResourceHealthStatusUnhealthy})))

	stopPlugin()
	unknown := heldHealth(alloc, corev1.ResourceHealthStatusUnknown, nil)
	got.wait(t, "health", "every device Unknown once the plugin is gone", healthIs(unknown))

	deleting := pod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	if err := p.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	final := got.wait(t, "health", "terminated", func(p *corev1.Pod) bool { return terminal(p) })
	if h := deviceHealth(final); !reflect.DeepEqual(h, unknown) {
		t.Errorf("terminal status health %v, want the last known %v", h, unknown)
	}
	if host.Manager.PodAllocation(pod.UID) != nil {
		t.Error("devices still held after the pod terminated")
	}
	// A later report from the backend (it knows nothing of devices) about
	// the terminated pod keeps the health too.
	if err := p.be.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	if again, _ := p.pods.GetPodByName("ns", "health"); again == final || !reflect.DeepEqual(deviceHealth(again), unknown) {
		t.Errorf("after another backend report: health %v, want the last known %v", deviceHealth(again), unknown)
	}
}

// TestPublishKeepsLastState checks that when two reports of one pod are
// handed to the pod controller at once (the backend's and the health
// watcher's, say), the controller is left with the last state stored,
// whichever hand-over finishes first.
func TestPublishKeepsLastState(t *testing.T) {
	_, _, p := startProvider(t, testdir.Short(t, "vnp"))
	release := make(chan struct{})
	var mu sync.Mutex
	calls, last := 0, ""
	p.notify = func(pod *corev1.Pod) {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			<-release // the first hand-over is slow
		}
		mu.Lock()
		last = pod.Status.Message
		mu.Unlock()
	}
	report := func(msg string) chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			p.backendNotify(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Status: corev1.PodStatus{Message: msg}})
		}()
		return done
	}
	spinUntil := func(what string, cond func() bool) {
		deadline := time.After(10 * time.Second)
		for !cond() {
			select {
			case <-deadline:
				t.Fatalf("timed out waiting for %s", what)
			default:
				runtime.Gosched()
			}
		}
	}
	first := report("first")
	spinUntil("the first hand-over", func() bool { mu.Lock(); defer mu.Unlock(); return calls == 1 })
	second := report("second")
	spinUntil("the second report stored", func() bool {
		pod, _ := p.pods.GetPodByName("ns", "p")
		return pod.Status.Message == "second"
	})
	close(release)
	<-first
	<-second
	if last != "second" {
		t.Fatalf("the pod controller was left with the %s report, want the second", last)
	}
}
