package exporter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/pkg/podresources"
)

// fakeNode is the node a real podresources.Server answers for: pods with
// device plugin devices and DRA claims, and the lists it was asked for.
type fakeNode struct {
	mu          sync.Mutex
	pods        []*corev1.Pod
	devices     map[string][]*podresourcesv1.ContainerDevices // uid/container
	dra         map[string][]*podresourcesv1.DynamicResource
	allocatable []*podresourcesv1.ContainerDevices
	lists       atomic.Int32
}

func (n *fakeNode) GetActivePods() []*corev1.Pod {
	n.lists.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]*corev1.Pod(nil), n.pods...)
}

func (n *fakeNode) GetPodByName(ns, name string) (*corev1.Pod, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range n.pods {
		if p.Namespace == ns && p.Name == name {
			return p, true
		}
	}
	return nil, false
}

func (n *fakeNode) GetDevices(uid, container string) []*podresourcesv1.ContainerDevices {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.devices[uid+"/"+container]
}

func (n *fakeNode) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.allocatable
}

func (n *fakeNode) GetDynamicResources(pod *corev1.Pod, c *corev1.Container) []*podresourcesv1.DynamicResource {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dra[string(pod.UID)+"/"+c.Name]
}

func (n *fakeNode) addPod(ns, name, container string, devs []*podresourcesv1.ContainerDevices, dra []*podresourcesv1.DynamicResource) {
	n.mu.Lock()
	defer n.mu.Unlock()
	uid := types.UID(ns + "-" + name)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	p.Spec.Containers = []corev1.Container{{Name: container}}
	n.pods = append(n.pods, p)
	if n.devices == nil {
		n.devices = map[string][]*podresourcesv1.ContainerDevices{}
		n.dra = map[string][]*podresourcesv1.DynamicResource{}
	}
	n.devices[string(uid)+"/"+container] = devs
	n.dra[string(uid)+"/"+container] = dra
}

func (n *fakeNode) deletePod(ns, name string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for i, p := range n.pods {
		if p.Namespace == ns && p.Name == name {
			n.pods = append(n.pods[:i], n.pods[i+1:]...)
			return
		}
	}
}

// serve serves n's PodResources API on socket, with the kubelet's rate
// limit, until the returned stop is called.
func serve(t testing.TB, n *fakeNode, socket string) (stop func()) {
	return serveQPS(t, n, socket, 0)
}

// serveQPS is serve with the rate limit's QPS: 0 for the kubelet's, -1
// for none.
func serveQPS(t testing.TB, n *fakeNode, socket string, qps float64) (stop func()) {
	t.Helper()
	srv, err := podresources.NewServer(podresources.Config{Providers: podresources.Providers{Pods: n, Devices: n, DynamicResources: n}, QPS: qps})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	l, err := podresourcesListen(socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- srv.ServeListener(ctx, l) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serving PodResources: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func gpu(ids ...string) []*podresourcesv1.ContainerDevices {
	return []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: ids,
		Topology: &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: 0}}}}}
}

func claim(ns, name, device string) []*podresourcesv1.DynamicResource {
	return []*podresourcesv1.DynamicResource{{ClaimName: name, ClaimNamespace: ns, ClaimResources: []*podresourcesv1.ClaimResource{{
		DriverName: "fake.dpkit.io", PoolName: "node-1", DeviceName: device,
		CdiDevices: []*podresourcesv1.CDIDevice{{Name: "fake.dpkit.io/claim=" + name + "-" + device}},
	}}}}
}

type podSource struct {
	mu   sync.Mutex
	pods map[PodKey]PodInfo
	err  error
}

func (p *podSource) Pods(context.Context) (map[PodKey]PodInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pods, p.err
}

func newExporter(t testing.TB, cfg Config) (*Exporter, *clocktesting.FakeClock) {
	t.Helper()
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	cfg.Clock = fc
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, fc
}

const deviceHelp = `# HELP dpkit_pod_device_allocated 1 for every device a pod's container holds: device plugins' by resource and device ID, DRA devices by claim, driver, pool and device.
# TYPE dpkit_pod_device_allocated gauge
`

// TestMetrics: device plugin devices and DRA devices of running pods,
// with the pod labels asked for and the health of pod status (by device
// ID, and for DRA by the first CDI device name under claim:<name>/<req>,
// name being the pod's reference to ResourceClaim c1);
// the allocatable and allocated counts; the health of a device the pod
// status has not got comes from the HealthSource.
func TestMetrics(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{allocatable: gpu("gpu0", "gpu1", "gpu2", "gpu3")}
	n.addPod("ns", "train", "main", gpu("gpu0", "gpu1"), claim("ns", "c1", "dev-0"))
	serve(t, n, socket)
	pods := &podSource{pods: map[PodKey]PodInfo{{"ns", "train"}: {
		Labels: map[string]string{"app.kubernetes.io/name": "trainer", "team": "ml"},
		Health: map[string]map[string]map[string]string{"main": {
			"example.com/gpu": {"gpu0": Healthy},
			"claim:gpus/req":  {"fake.dpkit.io/claim=c1-dev-0": Unhealthy},
		}},
	}}}
	e, _ := newExporter(t, Config{Socket: socket, Pods: pods, PodLabels: []string{"app.kubernetes.io/name"},
		Health: healthFunc(func(d []Device) map[string]string {
			out := map[string]string{}
			for _, x := range d {
				out[x.ID] = Unknown
			}
			return out
		})})
	want := deviceHelp + `dpkit_pod_device_allocated{claim="",claim_namespace="",container="main",device="",device_id="gpu0",driver="",label_app_kubernetes_io_name="trainer",namespace="ns",numa_node="0",pod="train",pool="",resource="example.com/gpu",share=""} 1
dpkit_pod_device_allocated{claim="",claim_namespace="",container="main",device="",device_id="gpu1",driver="",label_app_kubernetes_io_name="trainer",namespace="ns",numa_node="0",pod="train",pool="",resource="example.com/gpu",share=""} 1
dpkit_pod_device_allocated{claim="c1",claim_namespace="ns",container="main",device="dev-0",device_id="fake.dpkit.io/node-1/dev-0",driver="fake.dpkit.io",label_app_kubernetes_io_name="trainer",namespace="ns",numa_node="",pod="train",pool="node-1",resource="",share=""} 1
# HELP dpkit_node_resource_allocatable Devices of each device plugin resource the kubelet can give out (GetAllocatableResources).
# TYPE dpkit_node_resource_allocatable gauge
dpkit_node_resource_allocatable{resource="example.com/gpu"} 4
# HELP dpkit_node_resource_allocated Devices of each device plugin resource held by pods.
# TYPE dpkit_node_resource_allocated gauge
dpkit_node_resource_allocated{resource="example.com/gpu"} 2
# HELP dpkit_node_dra_devices_allocated DRA devices held by pods' claims, by driver and pool.
# TYPE dpkit_node_dra_devices_allocated gauge
dpkit_node_dra_devices_allocated{driver="fake.dpkit.io",pool="node-1"} 1
# HELP dpkit_exporter_podresources_up 1 when the last read of the PodResources API succeeded.
# TYPE dpkit_exporter_podresources_up gauge
dpkit_exporter_podresources_up 1
`
	if err := testutil.CollectAndCompare(e, strings.NewReader(want), "dpkit_pod_device_allocated", "dpkit_node_resource_allocatable",
		"dpkit_node_resource_allocated", "dpkit_node_dra_devices_allocated", "dpkit_exporter_podresources_up"); err != nil {
		t.Error(err)
	}
	health := map[string]string{}
	for _, m := range gather(t, e, "dpkit_pod_device_health") {
		if m.value == 1 {
			health[m.labels["device_id"]] = m.labels["health"]
		}
	}
	wantHealth := map[string]string{"gpu0": Healthy, "gpu1": Unknown, "fake.dpkit.io/node-1/dev-0": Unhealthy}
	if len(health) != len(wantHealth) {
		t.Errorf("health = %v, want %v", health, wantHealth)
	}
	for id, h := range wantHealth {
		if health[id] != h {
			t.Errorf("health of %s = %q, want %q (all: %v)", id, health[id], h, health)
		}
	}
}

type healthFunc func([]Device) map[string]string

func (f healthFunc) Health(_ context.Context, d []Device) (map[string]string, error) {
	return f(d), nil
}

type sample struct {
	labels map[string]string
	value  float64
}

func gather(t testing.TB, c prometheus.Collector, name string) []sample {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []sample
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			s := sample{labels: map[string]string{}, value: m.GetGauge().GetValue() + m.GetCounter().GetValue()}
			for _, l := range m.GetLabel() {
				s.labels[l.GetName()] = l.GetValue()
			}
			out = append(out, s)
		}
	}
	return out
}

func value(t testing.TB, c prometheus.Collector, name string) float64 {
	t.Helper()
	s := gather(t, c, name)
	if len(s) != 1 {
		t.Fatalf("%s: %d samples, want 1", name, len(s))
	}
	return s[0].value
}

// TestCacheAndRateLimit: 100 scrapes at once, against a server with the
// kubelet's rate limit (burst 10), read List once and none is rejected; a
// scrape after the cache's time reads it again.
func TestCacheAndRateLimit(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{allocatable: gpu("gpu0")}
	n.addPod("ns", "a", "main", gpu("gpu0"), nil)
	serve(t, n, socket)
	e, fc := newExporter(t, Config{Socket: socket})
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 100 {
		wg.Go(func() {
			if len(gather(t, e, "dpkit_pod_device_allocated")) != 1 {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if got := n.lists.Load(); got != 1 || failed.Load() != 0 {
		t.Errorf("100 scrapes in one window: %d Lists, %d scrapes without the device; want 1 and 0", got, failed.Load())
	}
	fc.Step(DefaultCacheTTL)
	if value(t, e, "dpkit_exporter_podresources_up") != 1 || n.lists.Load() != 2 {
		t.Errorf("a scrape after the cache expired: %d Lists, want 2", n.lists.Load())
	}
}

// TestSocketRestartAndDeletedPod: the kubelet's socket goes away (up is
// 0, no device series) and is served again (up is 1), and a pod deleted
// meanwhile is gone from the metrics.
func TestSocketRestartAndDeletedPod(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{}
	n.addPod("ns", "a", "main", gpu("gpu0"), nil)
	n.addPod("ns", "b", "main", gpu("gpu1"), nil)
	stop := serve(t, n, socket)
	e, fc := newExporter(t, Config{Socket: socket, Timeout: time.Second})
	if got := len(gather(t, e, "dpkit_pod_device_allocated")); got != 2 {
		t.Fatalf("%d devices, want 2", got)
	}
	stop()
	fc.Step(DefaultCacheTTL)
	if up, got := value(t, e, "dpkit_exporter_podresources_up"), len(gather(t, e, "dpkit_pod_device_allocated")); up != 0 || got != 0 {
		t.Errorf("with the socket gone: up %v, %d devices; want 0, 0", up, got)
	}
	n.deletePod("ns", "a")
	serve(t, n, socket)
	fc.Step(DefaultCacheTTL)
	s := gather(t, e, "dpkit_pod_device_allocated")
	if up := value(t, e, "dpkit_exporter_podresources_up"); up != 1 || len(s) != 1 || s[0].labels["pod"] != "b" {
		t.Errorf("with the socket back: up %v, devices %v; want 1 and pod b's only", up, s)
	}
}

// TestPodSourceFails: when the API server cannot be read the devices are
// still there, without health, and dpkit_exporter_pod_source_up says so.
func TestPodSourceFails(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{}
	n.addPod("ns", "a", "main", gpu("gpu0"), nil)
	serve(t, n, socket)
	e, _ := newExporter(t, Config{Socket: socket, Pods: &podSource{err: errors.New("connection refused")}})
	if value(t, e, "dpkit_exporter_pod_source_up") != 0 || len(gather(t, e, "dpkit_pod_device_allocated")) != 1 || len(gather(t, e, "dpkit_pod_device_health")) != 0 {
		t.Error("a failing pod source: want pod_source_up 0, the device, no health")
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  Config
		want []string
	}{
		"no socket":            {Config{}, []string{"socket: the PodResources socket is required"}},
		"labels without pods":  {Config{Socket: "s", PodLabels: []string{"app"}}, []string{"podLabels: pod labels come from the API server"}},
		"labels that collide":  {Config{Socket: "s", Pods: &podSource{}, PodLabels: []string{"a.b", "a-b", ""}}, []string{`podLabels[1]: "a.b" and "a-b" are both the metric label label_a_b`, "podLabels[2]: empty label name"}},
		"negative TTL":         {Config{Socket: "s", CacheTTL: -time.Second}, []string{"cacheTTL: -1s is negative"}},
		"a good configuration": {Config{Socket: "s", Pods: &podSource{}, PodLabels: []string{"app", "team"}}, nil},
	} {
		err := tc.cfg.Validate()
		if tc.want == nil && err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want it to say %q", name, err, w)
			}
		}
	}
}

// TestDashboardMetrics: every dpkit_ metric the Grafana dashboard queries
// is one the exporter serves (with AMD readings and a pod source).
func TestDashboardMetrics(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "dpkit-exporter.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct{}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{allocatable: gpu("0000:29:00.0")}
	n.addPod("ns", "a", "main", gpu("0000:29:00.0"), claim("ns", "c", "d"))
	serve(t, n, socket)
	e, _ := newExporter(t, Config{Socket: socket, Pods: &podSource{pods: map[PodKey]PodInfo{{"ns", "a"}: {
		Health: map[string]map[string]map[string]string{"main": {"example.com/gpu": {"0000:29:00.0": Healthy}}},
	}}}, Collectors: []DeviceCollector{AMDCollector{SysfsRoot: filepath.Join("..", "discovery", "testdata", "hosts", "mi250", "sys")}}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(e)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, mf := range mfs {
		served[mf.GetName()] = true
	}
	used := regexp.MustCompile(`dpkit_[a-z_]+`).FindAllString(string(b), -1)
	if len(used) == 0 {
		t.Fatal("the dashboard queries no dpkit metric")
	}
	for _, name := range used {
		if !served[name] {
			t.Errorf("the dashboard queries %s, which the exporter does not serve", name)
		}
	}
}

// TestSharedDeviceSeries: two pods holding shares of one DRA device get
// a series each, told apart by their share.
func TestSharedDeviceSeries(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	n := &fakeNode{}
	for i, pod := range []string{"a", "b"} {
		c := claim("ns", "c-"+pod, "gpu-0")
		c[0].ClaimResources[0].ShareId = new(fmt.Sprintf("share-%d", i))
		n.addPod("ns", pod, "main", nil, c)
	}
	serve(t, n, socket)
	e, _ := newExporter(t, Config{Socket: socket})
	shares := map[string]string{}
	for _, m := range gather(t, e, "dpkit_pod_device_allocated") {
		shares[m.labels["pod"]] = m.labels["share"]
	}
	if want := map[string]string{"a": "share-0", "b": "share-1"}; !maps.Equal(shares, want) {
		t.Errorf("shares by pod %v, want %v", shares, want)
	}
}
