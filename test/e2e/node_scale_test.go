package e2e

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/repopath"
	"github.com/dpkit/dpkit/internal/syncbuf"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/draplugin"
	"github.com/dpkit/dpkit/pkg/resourcename"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
	"github.com/dpkit/dpkit/test/upstream"
)

// scale is one run of many virtual nodes in this process, each with an
// in-process fake device plugin (dpkit node --count N --plugin-config).
type scale struct {
	nodes, devices int
	prefix, root   string
	resource       corev1.ResourceName
	// fronts is how the plugin serves its devices and the pods ask for
	// them: "" through the device plugin API (the extended resource);
	// frontDRA through DRA alone (one ResourceSlice per node, every pod a
	// claim from a template); frontBoth through both, half the pods with
	// claims and half with the extended resource.
	fronts string

	// Measured.
	readyS         float64 // Run called -> every node Ready with its devices allocatable
	heapPerNodeKiB float64 // Go heap in use after a GC, per node (node + its plugin)
	rssPerNodeKiB  float64 // the process's resident memory, per node
	// rssIdlePerNodeKiB is the same after the 30 s the nodes are idle
	// (measureIdleQPS): what the runtime kept or gave back meanwhile.
	rssIdlePerNodeKiB float64
	rss0              uint64  // the process's resident memory before the nodes
	rootPerNodeKiB    float64 // what the nodes' roots take on their file system, per node
	createS, runS     float64 // pods created; creation start -> last pod Running
	podsRunningPerS   float64
	apiQPSPerNode     float64 // requests the API server served per second per node while idle
	apiPerPod         float64 // requests the API server served per pod while the pods were created and ran
	apiPerNodeStart   float64 // requests the API server served per node until every node was Ready
	// together creates the claim pods and the extended-resource pods
	// at once (fronts both), and counts what became of them: Running,
	// Failed (rejected at admission) or still pending once nothing
	// changed for settleQuiet.
	together                    bool
	runningN, failedN, pendingN int
	stop                        func()
	nodeRoots                   []string
	nodeNames                   []string
	allocatableTotal            int64
}

// scaleRoot makes the directory the nodes' roots go under: in
// DPKIT_SCALE_ROOT when set (a tmpfs, for instance, as a simulator's
// nodes may keep their state in memory), else in the temporary directory.
func scaleRoot(tb testing.TB) string {
	return testdir.In(tb, os.Getenv("DPKIT_SCALE_ROOT"), "vns")
}

// startScale starts s.nodes virtual nodes (sim backend) with s.devices
// fake devices each and waits until every node is Ready with its devices
// allocatable.
func startScale(tb testing.TB, ctx context.Context, kubeconfig string, c kubernetes.Interface, s *scale) {
	tb.Helper()
	root := scaleRoot(tb)
	s.root = root
	cfg := filepath.Join(root, "plugin.yaml")
	body := fmt.Sprintf("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: %s\n      count: %d\n", s.resource, s.devices)
	switch s.fronts {
	case frontDRA:
		body += "  fronts: [dra]\n"
	case frontBoth:
		body += "  fronts: [deviceplugin, dra]\n"
	}
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	o := noderun.Options{
		Kubeconfig: kubeconfig, Name: s.prefix, Root: root, Backend: "sim", Port: -1, NodeIP: "127.0.0.1",
		Taints: []string{virtualnode.DefaultTaintKey + ":NoSchedule"}, CPU: "100", Memory: "1Ti", Pods: "110",
		// kwok's client is not throttled; these are the values kwokctl
		// gives its components for "unlimited".
		Count: s.nodes, QPS: 5000, Burst: 10000, PluginConfig: cfg,
	}
	if err := o.Validate(); err != nil {
		tb.Fatal(err)
	}
	for i := range s.nodes {
		s.nodeNames = append(s.nodeNames, fmt.Sprintf("%s-%d", s.prefix, i))
		s.nodeRoots = append(s.nodeRoots, filepath.Join(root, s.nodeNames[i]))
	}
	if s.nodes == 1 {
		s.nodeNames, s.nodeRoots = []string{s.prefix}, []string{root}
	}

	heap0, rss0 := memoryInUse()
	s.rss0 = rss0
	req0, err := apiRequestsBy(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	allocatable := int64(s.devices)
	if s.fronts == frontDRA {
		allocatable = 0
	}
	ready := watchNodesReady(ctx, c, s.prefix+"-", s.nodes, s.resource, allocatable)
	start := time.Now()
	nctx, cancel := context.WithCancel(ctx)
	var runErr error
	exited := make(chan struct{})
	go func() {
		runErr = noderun.Run(nctx, slog.New(slog.DiscardHandler), o, nil)
		close(exited)
	}()
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			cancel()
			<-exited
			if runErr != nil && nctx.Err() == nil {
				tb.Errorf("dpkit node: %v", runErr)
			}
		})
	}
	tb.Cleanup(s.stop)
	select {
	case <-ready.done:
	case <-exited:
		tb.Fatalf("dpkit node exited: %v", runErr)
	case <-ctx.Done():
		tb.Fatalf("%d of %d nodes Ready with %d %s: %v", ready.count(), s.nodes, s.devices, s.resource, ctx.Err())
	}
	s.allocatableTotal = ready.allocatable()
	ready.stop()
	if s.fronts != "" {
		waitSlices(tb, ctx, c, s)
	}
	s.readyS = time.Since(start).Seconds()
	s.apiPerNodeStart = startRequests(tb, ctx, c, req0, s.nodes)
	heap1, rss1 := memoryInUse()
	// Signed: a run after another in the same process may start above
	// what its nodes need, once the other's memory is given back.
	s.heapPerNodeKiB = (float64(heap1) - float64(heap0)) / 1024 / float64(s.nodes)
	s.rssPerNodeKiB = (float64(rss1) - float64(rss0)) / 1024 / float64(s.nodes)
	s.rootPerNodeKiB = float64(diskUsage(root)) / 1024 / float64(s.nodes)
}

// startRequests returns the API requests per node served since req0 (the
// nodes' start) and logs the busiest kinds.
func startRequests(tb testing.TB, ctx context.Context, c kubernetes.Interface, req0 map[string]float64, nodes int) float64 {
	tb.Helper()
	req1, err := apiRequestsBy(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	per, busiest := requestsPer(req0, req1, float64(nodes))
	tb.Logf("API requests per node until all were Ready: %.2f; the busiest:%s", per, busiest)
	return per
}

// diskUsage is what the files under dir take on their file system (its
// blocks, as du counts them); on a tmpfs, memory.
func diskUsage(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil //nolint:nilerr // a file gone meanwhile counts nothing
		}
		if fi, err := d.Info(); err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// The scale.fronts that serve through DRA.
const (
	frontDRA  = "dra"
	frontBoth = "both"
)

// driver is the DRA driver the plugin's DRA front publishes as.
func (s *scale) driver() string { return resourcename.DriverName(string(s.resource)) }

// waitSlices waits until the DRA fronts publish every node's devices.
func waitSlices(tb testing.TB, ctx context.Context, c kubernetes.Interface, s *scale) {
	tb.Helper()
	want := s.nodes * s.devices
	poll(tb, ctx, fmt.Sprintf("%d devices in ResourceSlices of %s", want, s.driver()), func(ctx context.Context) (bool, string, error) {
		list, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.driver", s.driver()).String()})
		if err != nil {
			return false, "", err
		}
		n := 0
		for _, sl := range list.Items {
			n += len(sl.Spec.Devices)
		}
		return n == want, fmt.Sprintf("%d devices in %d slices", n, len(list.Items)), nil
	})
}

// scaleClaims makes the DeviceClass of s's driver (removed when tb ends)
// and, in ns, the template of the claims of s's DRA pods: one device.
func scaleClaims(tb testing.TB, ctx context.Context, c kubernetes.Interface, s *scale, ns string) {
	tb.Helper()
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: s.prefix}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", s.driver())}}},
	}}
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = c.ResourceV1().DeviceClasses().Delete(context.Background(), class.Name, metav1.DeleteOptions{})
	})
	tmpl := &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "dev"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name:    "dev",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class.Name, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1},
		}}}}},
	}
	if _, err := c.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
}

// runScalePods creates one single-device pod per device (20 clients) and
// waits until all are Running. With frontDRA every pod asks through a
// claim from a template. With frontBoth the first half do, and once they
// run and the nodes' allocatable has dropped by what they hold, the other
// half ask for the extended resource: created together, a claim and an
// extended-resource pod may be given the same device by the scheduler,
// and one of them waits (docs/dra-plugins.md, "races at admission").
func runScalePods(tb testing.TB, ctx context.Context, c kubernetes.Interface, s *scale) string {
	tb.Helper()
	ns := createNamespaceTB(tb, c, "scale")
	if s.fronts != "" {
		scaleClaims(tb, ctx, c, s, ns)
	}
	want := s.nodes * s.devices
	claims := 0
	switch s.fronts {
	case frontDRA:
		claims = want
	case frontBoth:
		claims = want / 2
	}
	w := watchPods(ctx, c, ns, want)
	defer w.stop()
	pod := func(i int) *corev1.Pod {
		p := benchPod(ns, fmt.Sprintf("p%d", i), s.prefix)
		if i < claims {
			p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: ptr("dev")}}
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}}
			return p
		}
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{s.resource: resource.MustParse("1")}
		return p
	}
	start := time.Now()
	if s.together {
		o := watchOutcomes(ctx, c, ns)
		defer o.stop()
		createPods(tb, ctx, c, ns, want, pod)
		s.createS = time.Since(start).Seconds()
		last := o.settle(ctx, want)
		s.runningN, s.failedN, s.pendingN = o.counts(want)
		s.runS = last.Sub(start).Seconds()
		s.podsRunningPerS = float64(s.runningN) / s.runS
		tb.Logf("%d pods created together: %d Running, %d Failed (%v), %d still pending %v after the last change",
			want, s.runningN, s.failedN, o.reasons(), s.pendingN, settleQuiet)
		return ns
	}
	if claims > 0 && claims < want {
		cw := watchPods(ctx, c, ns, claims)
		createPods(tb, ctx, c, ns, claims, pod)
		cw.wait(tb, ctx, "pods with claims")
		cw.stop()
		left := int64(want - claims)
		poll(tb, ctx, fmt.Sprintf("%d %s allocatable on the nodes", left, s.resource), func(ctx context.Context) (bool, string, error) {
			nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, "", err
			}
			var sum int64
			for _, n := range nodes.Items {
				if strings.HasPrefix(n.Name, s.prefix+"-") {
					q := n.Status.Allocatable[s.resource]
					sum += q.Value()
				}
			}
			return sum == left, fmt.Sprintf("%d allocatable", sum), nil
		})
		createPods(tb, ctx, c, ns, want-claims, func(i int) *corev1.Pod { return pod(claims + i) })
	} else {
		createPods(tb, ctx, c, ns, want, pod)
	}
	s.createS = time.Since(start).Seconds()
	w.wait(tb, ctx, "pods")
	s.runS = w.lastRunning.Sub(start).Seconds()
	s.podsRunningPerS = float64(want) / s.runS
	return ns
}

// checkNoDoubleAllocation reads every node's PodResources: each pod of ns
// holds exactly one device, through either front, no device is held
// twice, and every device is held.
func checkNoDoubleAllocation(tb testing.TB, ctx context.Context, s *scale, ns string) {
	tb.Helper()
	pods := 0
	for i, root := range s.nodeRoots {
		conn, err := grpc.NewClient("unix://"+filepath.Join(root, "pod-resources", "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			tb.Fatal(err)
		}
		resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		conn.Close()
		if err != nil {
			tb.Fatalf("node %s: PodResources List: %v", s.nodeNames[i], err)
		}
		held := map[string]string{}
		for _, p := range resp.GetPodResources() {
			if p.GetNamespace() != ns {
				continue
			}
			n := 0
			hold := func(dev string) {
				n++
				if other, ok := held[dev]; ok {
					tb.Errorf("node %s: device %s held by %s and %s", s.nodeNames[i], dev, other, p.GetName())
				}
				held[dev] = p.GetName()
			}
			for _, ctr := range p.GetContainers() {
				for _, d := range ctr.GetDevices() {
					if d.GetResourceName() != string(s.resource) {
						continue
					}
					for _, id := range d.GetDeviceIds() {
						// As the DRA front names the device.
						hold(draplugin.DeviceName(id))
					}
				}
				for _, dr := range ctr.GetDynamicResources() {
					for _, cr := range dr.GetClaimResources() {
						if cr.GetDriverName() == s.driver() {
							hold(cr.GetDeviceName())
						}
					}
				}
			}
			if n == 0 && s.together {
				continue // admitted, its claim not prepared: pending
			}
			if n != 1 {
				tb.Errorf("node %s: pod %s holds %d devices, want 1", s.nodeNames[i], p.GetName(), n)
			}
			pods++
		}
		if len(held) != s.devices && !s.together {
			tb.Errorf("node %s: %d of its %d devices held", s.nodeNames[i], len(held), s.devices)
		}
	}
	want := s.nodes * s.devices
	if s.together {
		want = s.runningN
	}
	if pods != want {
		tb.Errorf("PodResources lists %d pods of %s, want %d", pods, ns, want)
	}
}

// settleQuiet is how long no pod of a together run may change phase
// before the pods still pending are counted as waiting for good.
const settleQuiet = time.Minute

// outcomes follows the phases of a namespace's pods.
type outcomes struct {
	stop func()

	mu      sync.Mutex
	phase   map[string]corev1.PodPhase
	reason  map[string]string
	changed chan struct{}
	last    time.Time
}

func watchOutcomes(ctx context.Context, c kubernetes.Interface, ns string) *outcomes {
	o := &outcomes{phase: map[string]corev1.PodPhase{}, reason: map[string]string{}, changed: make(chan struct{}, 1), last: time.Now()}
	see := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		o.mu.Lock()
		if o.phase[p.Name] != p.Status.Phase {
			o.phase[p.Name] = p.Status.Phase
			o.reason[p.Name] = p.Status.Reason
			o.last = time.Now()
			select {
			case o.changed <- struct{}{}:
			default:
			}
		}
		o.mu.Unlock()
	}
	o.stop = seePods(ctx, c, ns, see)
	return o
}

// settle returns the time of the last phase change once want pods are
// Running or Failed, or none changed for settleQuiet (a measurement
// window: what still waits then waits on another pod's device).
func (o *outcomes) settle(ctx context.Context, want int) time.Time {
	for {
		running, failed, _ := o.counts(want)
		o.mu.Lock()
		last := o.last
		o.mu.Unlock()
		if running+failed == want {
			return last
		}
		select {
		case <-o.changed:
		case <-time.After(time.Until(last.Add(settleQuiet))):
			o.mu.Lock()
			quiet := time.Since(o.last) >= settleQuiet
			last = o.last
			o.mu.Unlock()
			if quiet {
				return last
			}
		case <-ctx.Done():
			return last
		}
	}
}

// counts are the pods Running, Failed and neither, of want.
func (o *outcomes) counts(want int) (running, failed, pending int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, ph := range o.phase {
		switch ph {
		case corev1.PodRunning:
			running++
		case corev1.PodFailed:
			failed++
		}
	}
	return running, failed, want - running - failed
}

// reasons counts the Failed pods by status reason.
func (o *outcomes) reasons() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]int{}
	for name, ph := range o.phase {
		if ph == corev1.PodFailed {
			out[o.reason[name]]++
		}
	}
	return out
}

// nodesReady counts the nodes named prefix* that are Ready with want of
// res allocatable, through one watch of all nodes.
type nodesReady struct {
	done chan struct{}
	stop func()

	mu    sync.Mutex
	ready map[string]int64
}

func watchNodesReady(ctx context.Context, c kubernetes.Interface, prefix string, n int, res corev1.ResourceName, want int64) *nodesReady {
	r := &nodesReady{done: make(chan struct{}), ready: map[string]int64{}}
	see := func(obj any) {
		node, ok := obj.(*corev1.Node)
		if !ok || !strings.HasPrefix(node.Name, prefix) {
			return
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
		}
		q := node.Status.Allocatable[res]
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, seen := r.ready[node.Name]; seen || !ready || q.Value() != want {
			return
		}
		r.ready[node.Name] = q.Value()
		if len(r.ready) == n {
			close(r.done)
		}
	}
	f := informers.NewSharedInformerFactory(c, 0)
	inf := f.Core().V1().Nodes().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, obj any) { see(obj) }})
	ctx, cancel := context.WithCancel(ctx)
	f.StartWithContext(ctx)
	f.WaitForCacheSync(ctx.Done())
	r.stop = func() { cancel(); f.Shutdown() }
	return r
}

func (r *nodesReady) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ready)
}

func (r *nodesReady) allocatable() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum int64
	for _, v := range r.ready {
		sum += v
	}
	return sum
}

// memoryInUse returns the Go heap in use after a collection and the process's
// resident set, in bytes.
func memoryInUse() (heap, rss uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, processRSS(os.Getpid())
}

// processRSS reads VmRSS from /proc/PID/status; 0 when it cannot.
func processRSS(pid int) uint64 {
	kb, _ := statusKiB(pid, "VmRSS:")
	return kb * 1024
}

// apiRequests is the API server's apiserver_request_total, summed.
func apiRequests(ctx context.Context, c kubernetes.Interface) (float64, error) {
	by, err := apiRequestsBy(ctx, c)
	var sum float64
	for _, v := range by {
		sum += v
	}
	return sum, err
}

// apiRequestsBy is the API server's apiserver_request_total by verb and
// resource ("PATCH pods/status").
func apiRequestsBy(ctx context.Context, c kubernetes.Interface) (map[string]float64, error) {
	body, err := c.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			continue
		}
		labels := map[string]string{}
		for _, m := range metricLabel.FindAllStringSubmatch(line, -1) {
			labels[m[1]] = m[2]
		}
		kind := labels["verb"] + " " + labels["resource"]
		if labels["subresource"] != "" {
			kind += "/" + labels["subresource"]
		}
		out[kind] += v
	}
	return out, nil
}

var metricLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// runMeasuredPods is runScalePods measured: the CPU each process of pids
// used and the requests the API server served per pod while the pods
// were created and ran (everyone's: the clients', the scheduler's, the
// nodes'), the busiest kinds logged.
func runMeasuredPods(tb testing.TB, ctx context.Context, c kubernetes.Interface, s *scale, pids map[string]int) (ns string, cpu0, cpu1 map[string]float64) {
	tb.Helper()
	req0, err := apiRequestsBy(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	cpu0 = cpuSeconds(pids)
	ns = runScalePods(tb, ctx, c, s)
	cpu1 = cpuSeconds(pids)
	req1, err := apiRequestsBy(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	var busiest string
	s.apiPerPod, busiest = requestsPer(req0, req1, float64(s.nodes*s.devices))
	tb.Logf("API requests per pod: %.2f; the busiest:%s", s.apiPerPod, busiest)
	return ns, cpu0, cpu1
}

// requestsPer is the requests served between two apiRequestsBy readings,
// divided by n, and the ten busiest kinds, each divided by n.
func requestsPer(req0, req1 map[string]float64, n float64) (float64, string) {
	type kind struct {
		name string
		n    float64
	}
	var kinds []kind
	var total float64
	for name, v := range req1 {
		if d := v - req0[name]; d > 0 {
			kinds = append(kinds, kind{name, d})
			total += d
		}
	}
	slices.SortFunc(kinds, func(a, b kind) int { return cmp.Compare(b.n, a.n) })
	var b strings.Builder
	for _, k := range kinds[:min(len(kinds), 10)] {
		fmt.Fprintf(&b, " %s %.2f;", k.name, k.n/n)
	}
	return total / n, b.String()
}

// measureIdleQPS counts the requests the API server serves over window,
// per node: with no pods changing, that is the nodes' Leases and status
// updates (and the control plane's own few).
func measureIdleQPS(tb testing.TB, ctx context.Context, c kubernetes.Interface, nodes int, window time.Duration) float64 {
	tb.Helper()
	r0, err := apiRequests(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	t0 := time.Now()
	select { // a measurement window, not a synchronisation
	case <-time.After(window):
	case <-ctx.Done():
		tb.Fatal(ctx.Err())
	}
	r1, err := apiRequests(ctx, c)
	if err != nil {
		tb.Fatal(err)
	}
	return (r1 - r0) / time.Since(t0).Seconds() / float64(nodes)
}

// TestVirtualNodeInProcessPlugins runs three virtual nodes in one process,
// each serving the fake plugin in-process (--plugin-config): all Ready with
// their 4 devices, 12 single-device pods Running, every device held once.
func TestVirtualNodeInProcessPlugins(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	prefix := unique("inproc")
	s := &scale{nodes: 3, devices: 4, prefix: prefix, resource: corev1.ResourceName("e2e.dpkit.io/" + prefix)}
	w, err := c.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	startScale(t, ctx, cp.Kubeconfig, c, s)
	if s.allocatableTotal != 12 {
		t.Fatalf("allocatable %d, want 12", s.allocatableTotal)
	}
	// The plugins have no dra front: they start before their nodes
	// register, and each Node is created with their devices.
	for added := 0; added < s.nodes; {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-ctx.Done():
			t.Fatalf("%d of %d nodes seen created: %v", added, s.nodes, ctx.Err())
		}
		n, ok := ev.Object.(*corev1.Node)
		if !ok || ev.Type != watch.Added || !strings.HasPrefix(n.Name, prefix+"-") {
			continue
		}
		added++
		if q := n.Status.Allocatable[s.resource]; q.Value() != 4 {
			t.Errorf("node %s created with %s allocatable, want its plugin's 4 devices", n.Name, q.String())
		}
	}
	ns := runScalePods(t, ctx, c, s)
	checkNoDoubleAllocation(t, ctx, s, ns)
	t.Logf("3 nodes Ready in %.1fs, 12 pods Running in %.1fs", s.readyS, s.runS)
}

// TestVirtualNodeInProcessDRA is TestVirtualNodeInProcessPlugins with the
// plugins serving both fronts: every node publishes its devices in a
// ResourceSlice as well as its allocatable, half the pods ask through
// claims from a template (kube-controller-manager makes them), and no
// device is held twice across the fronts.
func TestVirtualNodeInProcessDRA(t *testing.T) {
	cp, c := benchControlPlaneWith(t, controlplane.Options{Scheduler: true, ControllerManager: true})
	ctx := testContext(t)
	prefix := unique("inprocdra")
	s := &scale{nodes: 3, devices: 4, prefix: prefix, resource: corev1.ResourceName("e2e.dpkit.io/" + prefix), fronts: frontBoth}
	startScale(t, ctx, cp.Kubeconfig, c, s)
	ns := runScalePods(t, ctx, c, s)
	checkNoDoubleAllocation(t, ctx, s, ns)
	t.Logf("3 nodes Ready with their slices in %.1fs, 12 pods (6 with claims) Running in %.1fs", s.readyS, s.runS)
}

// scaleSize is the number of nodes and devices per node of the scale
// benchmarks: DPKIT_SCALE_NODES (default 1000) and DPKIT_SCALE_DEVICES
// (default 8).
func scaleSize(tb testing.TB) (nodes, devices int) {
	nodes, devices = 1000, 8
	for _, v := range []struct {
		env string
		p   *int
	}{{"DPKIT_SCALE_NODES", &nodes}, {"DPKIT_SCALE_DEVICES", &devices}} {
		if s := os.Getenv(v.env); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				tb.Fatalf("%s=%q: want a positive number", v.env, s)
			}
			*v.p = n
		}
	}
	return nodes, devices
}

// BenchmarkVirtualNodeFootprint is where a node's memory goes: N idle
// nodes (DPKIT_SCALE_NODES, default 1000) of dpkit node --count N --backend
// sim --plugin-config <fake, 8 devices> in this process, Ready with their
// devices, and what they added per node: goroutines, their stacks, Go
// heap in use and the process's resident memory. With DPKIT_PROFILE_DIR
// set, the goroutines (by stack) and the heap are written there
// (goroutines.txt, heap.pprof) for go tool pprof, and the CPU profile of
// the nodes' start (cpu-start-<prefix>.pprof). Run with -benchtime 1x.
func BenchmarkVirtualNodeFootprint(b *testing.B) {
	nodes, devices := scaleSize(b)
	cp, c := benchControlPlane(b, 1000, 2000)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	dir := os.Getenv("DPKIT_PROFILE_DIR")
	if dir != "" {
		runtime.MemProfileRate = 4096
	}
	for range b.N {
		before := footprintNow()
		s := &scale{nodes: nodes, devices: devices, prefix: unique("fp"), resource: benchResource}
		cpu0 := cpuSeconds(benchPIDs(cp, nil))
		stopProfile := profileCPU(b, "cpu-start-"+s.prefix)
		startScale(b, ctx, cp.Kubeconfig, c, s)
		stopProfile()
		reportStartCPU(b, cpu0, cpuSeconds(benchPIDs(cp, nil)))
		after := footprintNow()
		per := func(a, b uint64) float64 { return (float64(b) - float64(a)) / float64(nodes) }
		b.ReportMetric(per(before.goroutines, after.goroutines), "goroutines/node")
		b.ReportMetric(per(before.stack, after.stack)/1024, "stack_KiB/node")
		b.ReportMetric(per(before.heap, after.heap)/1024, "heap_KiB/node")
		b.ReportMetric(per(before.rss, after.rss)/1024, "rss_KiB/node")
		b.ReportMetric(s.rootPerNodeKiB, "root_KiB/node")
		b.ReportMetric(s.readyS, "all_ready_s")
		b.ReportMetric(s.apiPerNodeStart, "start_api_requests/node")
		if dir != "" {
			writeProfile(b, filepath.Join(dir, "goroutines.txt"), "goroutine", 1)
			writeProfile(b, filepath.Join(dir, "heap.pprof"), "heap", 0)
		}
		s.stop()
	}
}

// footprint is the process's goroutines and memory after a GC.
type footprint struct{ goroutines, stack, heap, rss uint64 }

func footprintNow() footprint {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return footprint{uint64(runtime.NumGoroutine()), ms.StackInuse, ms.HeapInuse, processRSS(os.Getpid())}
}

// BenchmarkVirtualNodeScale is the 1000-node run (docs/performance.md):
// dpkit node --count N --backend sim --plugin-config <fake, D devices> in
// this process against a control plane of its own (scheduler QPS 1000);
// every node Ready with its devices, then N*D single-device pods Running,
// checked through every node's PodResources for devices held twice. With
// DPKIT_PROFILE_DIR set, the CPU profile of the pods' window is written
// there (cpu-pods-<prefix>.pprof). Run with -benchtime 1x.
func BenchmarkVirtualNodeScale(b *testing.B) {
	nodes, devices := scaleSize(b)
	cp, c := benchControlPlane(b, 1000, 2000)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	for range b.N {
		benchScale(b, ctx, cp, c, &scale{nodes: nodes, devices: devices, prefix: unique("scale"), resource: benchResource})
	}
}

// benchScale is one measured run of s: its nodes started, the API
// requests they make while idle, its pods run (with the control plane's
// CPU), every node's devices checked, the figures reported.
func benchScale(b *testing.B, ctx context.Context, cp *controlplane.ControlPlane, c kubernetes.Interface, s *scale) {
	startScale(b, ctx, cp.Kubeconfig, c, s)
	s.apiQPSPerNode = measureIdleQPS(b, ctx, c, s.nodes, 30*time.Second)
	s.rssIdlePerNodeKiB = (float64(processRSS(os.Getpid())) - float64(s.rss0)) / 1024 / float64(s.nodes)
	stopProfile := profileCPU(b, "cpu-pods-"+s.prefix)
	ns, cpu0, cpu1 := runMeasuredPods(b, ctx, c, s, benchPIDs(cp, nil))
	stopProfile()
	checkNoDoubleAllocation(b, ctx, s, ns)
	reportScale(b, s, cpu0, cpu1)
	s.stop()
}

// profileCPU starts a CPU profile of this process (the nodes and the
// clients) when DPKIT_PROFILE_DIR is set, written to <dir>/<name>.pprof by
// the function it returns, with the allocations made meanwhile
// (<name>-allocs.pprof and <name>-allocs-base.pprof: go tool pprof
// -sample_index=alloc_space -base <base> <allocs>): the pods' window of the
// scale benchmarks (cpu-pods-<prefix>), the nodes' start in
// BenchmarkVirtualNodeFootprint (cpu-start-<prefix>).
func profileCPU(b *testing.B, name string) func() {
	dir := os.Getenv("DPKIT_PROFILE_DIR")
	if dir == "" {
		return func() {}
	}
	writeProfile(b, filepath.Join(dir, name+"-allocs-base.pprof"), "allocs", 0)
	f, err := os.Create(filepath.Join(dir, name+".pprof"))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
		writeProfile(b, filepath.Join(dir, name+"-allocs.pprof"), "allocs", 0)
	}
}

// writeProfile writes the named runtime profile to path (debug as
// pprof.Profile.WriteTo takes it: 0 for go tool pprof, 1 for text).
func writeProfile(b *testing.B, path, profile string, debug int) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	err = pprof.Lookup(profile).WriteTo(f, debug)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkVirtualNodeScaleDRA is BenchmarkVirtualNodeScale through DRA,
// with kube-controller-manager running, each on a control plane of its
// own: "dra", the in-process plugins serving DRA alone (one ResourceSlice
// per node) and every pod asking for its device through a claim from a
// template; "both", the plugins serving both fronts, half the pods with
// claims and then half with the extended resource. No device is held
// twice, across the fronts.
func BenchmarkVirtualNodeScaleDRA(b *testing.B) {
	nodes, devices := scaleSize(b)
	for _, fronts := range []string{frontDRA, frontBoth} {
		b.Run(fronts, func(b *testing.B) {
			cp, c := benchControlPlaneWith(b, controlplane.Options{Scheduler: true, SchedulerQPS: 1000, SchedulerBurst: 2000, ControllerManager: true})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			for range b.N {
				benchScale(b, ctx, cp, c, &scale{nodes: nodes, devices: devices, prefix: unique("scaledra"), resource: benchResource, fronts: fronts})
			}
		})
	}
	// "together": both fronts, the claim pods and the extended-resource
	// pods created at once; some extended-resource pods are rejected
	// where the scheduler counted a device a claim was just allocated.
	b.Run("together", func(b *testing.B) {
		cp, c := benchControlPlaneWith(b, controlplane.Options{Scheduler: true, SchedulerQPS: 1000, SchedulerBurst: 2000, ControllerManager: true})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		defer cancel()
		for range b.N {
			s := &scale{nodes: nodes, devices: devices, prefix: unique("scaledra"), resource: benchResource, fronts: frontBoth, together: true}
			benchScale(b, ctx, cp, c, s)
			b.ReportMetric(float64(s.runningN), "pods_running")
			b.ReportMetric(float64(s.failedN), "pods_failed")
			b.ReportMetric(float64(s.pendingN), "pods_pending")
		}
	})
}

// BenchmarkKwokScale is BenchmarkVirtualNodeScale with kwok managing the
// nodes (which it cannot give devices: the capacity is only declared), two
// ways: "no-lease", the kwok binary's defaults (its nodes renew no Lease);
// "kubelet-lease", each node's Lease kept as the kubelet keeps it and as
// dpkit's nodes do (--node-lease-duration-seconds=40, renewed every 10 s;
// kwokctl's clusters run kwok with a Lease too, of 200 s). Skipped until
// kwok is built with hack/build-kwok.sh.
func BenchmarkKwokScale(b *testing.B) {
	nodes, devices := scaleSize(b)
	kw := kwokBinaries(b)
	for _, v := range []struct {
		name         string
		leaseSeconds int
	}{{"no-lease", 0}, {"kubelet-lease", kubeletLeaseSeconds}} {
		b.Run(v.name, func(b *testing.B) {
			cp, c := benchControlPlane(b, 1000, 2000)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
			defer cancel()
			for range b.N {
				benchKwok(b, ctx, cp, c, kw, v.leaseSeconds, &scale{nodes: nodes, devices: devices, prefix: unique("kwok"), resource: benchResource})
			}
		})
	}
}

// kubeletLeaseSeconds is the kubelet's nodeLeaseDurationSeconds (its
// default, and dpkit's nodes'): a Lease renewed every quarter of it.
const kubeletLeaseSeconds = 40

// benchKwok is one measured run of s with kwok managing the nodes,
// renewing their Leases when leaseSeconds is not 0.
func benchKwok(b *testing.B, ctx context.Context, cp *controlplane.ControlPlane, c kubernetes.Interface, kw [2]string, leaseSeconds int, s *scale) {
	ready := watchNodesReady(ctx, c, s.prefix+"-", s.nodes, benchResource, int64(s.devices))
	req0, err := apiRequestsBy(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	pid, _ := startKwok(b, cp, kw, leaseSeconds)
	pids := benchPIDs(cp, map[string]int{"kwok": pid})
	cpu0 := cpuSeconds(pids)
	rss0 := processRSS(pid)
	createKwokNodes(b, ctx, c, s.prefix, s.nodes, s.devices)
	select {
	case <-ready.done:
	case <-ctx.Done():
		b.Fatalf("%d of %d kwok nodes Ready: %v", ready.count(), s.nodes, ctx.Err())
	}
	s.readyS = time.Since(start).Seconds()
	ready.stop()
	reportStartCPU(b, cpu0, cpuSeconds(pids))
	s.apiPerNodeStart = startRequests(b, ctx, c, req0, s.nodes)
	s.rssPerNodeKiB = (float64(processRSS(pid)) - float64(rss0)) / 1024 / float64(s.nodes)
	s.apiQPSPerNode = measureIdleQPS(b, ctx, c, s.nodes, 30*time.Second)
	s.rssIdlePerNodeKiB = (float64(processRSS(pid)) - float64(rss0)) / 1024 / float64(s.nodes)
	_, cpu0, cpu1 := runMeasuredPods(b, ctx, c, s, pids)
	reportScale(b, s, cpu0, cpu1)
}

func benchPIDs(cp *controlplane.ControlPlane, extra map[string]int) map[string]int {
	pids := map[string]int{"bench": os.Getpid()}
	for name, pid := range cp.PIDs() {
		pids[name] = pid
	}
	for name, pid := range extra {
		pids[name] = pid
	}
	return pids
}

// reportStartCPU reports the CPU each process used while the nodes
// started (start_<process>_cpu_s).
func reportStartCPU(b *testing.B, cpu0, cpu1 map[string]float64) {
	for name, t := range cpu1 {
		b.ReportMetric(t-cpu0[name], "start_"+strings.TrimPrefix(name, "kube-")+"_cpu_s")
	}
}

func reportScale(b *testing.B, s *scale, cpu0, cpu1 map[string]float64) {
	b.ReportMetric(s.readyS, "all_ready_s")
	b.ReportMetric(s.createS, "create_s")
	b.ReportMetric(s.runS, "all_running_s")
	b.ReportMetric(s.podsRunningPerS, "pods_running/s")
	if s.heapPerNodeKiB > 0 {
		b.ReportMetric(s.heapPerNodeKiB, "heap_KiB/node")
	}
	b.ReportMetric(s.rssPerNodeKiB, "rss_KiB/node")
	b.ReportMetric(s.rssIdlePerNodeKiB, "rss_idle_KiB/node")
	if s.rootPerNodeKiB > 0 {
		b.ReportMetric(s.rootPerNodeKiB, "root_KiB/node")
	}
	b.ReportMetric(s.apiQPSPerNode, "idle_api_qps/node")
	b.ReportMetric(s.apiPerPod, "api_requests/pod")
	b.ReportMetric(s.apiPerNodeStart, "start_api_requests/node")
	for name, t := range cpu1 {
		b.ReportMetric(t-cpu0[name], strings.TrimPrefix(name, "kube-")+"_cpu_s")
	}
}

// kwokBinaries returns kwok and its stages, skipping b when they are not
// built.
func kwokBinaries(b *testing.B) [2]string {
	dir := kwokDir()
	kw := [2]string{filepath.Join(dir, "kwok"), filepath.Join(dir, "stages.yaml")}
	for _, f := range kw {
		if _, err := os.Stat(f); err != nil {
			b.Skipf("kwok %s not built (%v); build it with: bash %s", kwokVersion, err, repopath.Find("hack/build-kwok.sh"))
		}
	}
	return kw
}

// startKwok starts kwok on cp's API server until b ends and returns its
// process ID and a channel that has kwok's exit if it ends before.
func startKwok(b *testing.B, cp *controlplane.ControlPlane, kw [2]string, leaseSeconds int) (int, <-chan error) {
	logPath := filepath.Join(cp.Dir, "kwok.log")
	log, err := os.Create(logPath)
	if err != nil {
		b.Fatal(err)
	}
	// kwok's own client has no rate limit.
	cmd := upstream.Command(kw[0],
		"--kubeconfig="+cp.Kubeconfig,
		"--config="+kw[1],
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--cidr=10.0.0.0/16",
		"--v=WARN",
		"--node-lease-duration-seconds="+strconv.Itoa(leaseSeconds),
	)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatalf("start kwok: %v", err)
	}
	exited, early := make(chan error, 1), make(chan error, 1)
	go func() {
		err := cmd.Wait()
		exited <- err
		early <- err
	}()
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		log.Close()
		if b.Failed() {
			if data, err := os.ReadFile(logPath); err == nil {
				b.Logf("kwok.log (tail):\n%s", data[max(0, len(data)-8<<10):])
			}
		}
	})
	return cmd.Process.Pid, early
}

// createKwokNodes creates the nodes kwok manages, each declaring devices
// of benchResource, and lifts the not-ready taint the API server puts on
// them once kwok reports them Ready (kube-controller-manager would; the
// test control plane has none).
func createKwokNodes(b *testing.B, ctx context.Context, c kubernetes.Interface, prefix string, nodes, devices int) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range benchWorkers {
		wg.Go(func() {
			for i := range jobs {
				n := kwokNode(fmt.Sprintf("%s-%d", prefix, i))
				q := *resource.NewQuantity(int64(devices), resource.DecimalSI)
				n.Status.Capacity[benchResource], n.Status.Allocatable[benchResource] = q, q
				n.Status.Capacity[corev1.ResourcePods], n.Status.Allocatable[corev1.ResourcePods] = resource.MustParse("110"), resource.MustParse("110")
				if _, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for i := range nodes {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	go liftNotReadyTaints(ctx, c, prefix+"-")
}

// liftNotReadyTaints removes node.kubernetes.io/not-ready from Ready nodes
// named prefix* until ctx ends.
func liftNotReadyTaints(ctx context.Context, c kubernetes.Interface, prefix string) {
	f := informers.NewSharedInformerFactory(c, 0)
	inf := f.Core().V1().Nodes().Informer()
	lift := func(obj any) {
		n, ok := obj.(*corev1.Node)
		if !ok || !strings.HasPrefix(n.Name, prefix) {
			return
		}
		ready, tainted := false, false
		for _, cond := range n.Status.Conditions {
			ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
		}
		var keep []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				tainted = true
				continue
			}
			keep = append(keep, t)
		}
		if !ready || !tainted {
			return
		}
		n = n.DeepCopy()
		n.Spec.Taints = keep
		_, _ = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}) // a conflict comes back as an update
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: lift, UpdateFunc: func(_, obj any) { lift(obj) }})
	f.StartWithContext(ctx)
	<-ctx.Done()
	f.Shutdown()
}

// TestVirtualNodeInProcessPluginsQuietStop starts `dpkit node --count 2
// --plugin-config` and stops it as Ctrl-C does, long after the plugins
// registered (their clock moved past the guard after a registration):
// nothing is logged at WARN or above. Each plugin starts once its node
// serves its registration socket (started with the node, it logged a
// failed registration every time), and the nodes stop after their
// plugins, as dpkit up's do.
func TestVirtualNodeInProcessPluginsQuietStop(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	// What a stop in the wrong order logs depends on which side sees the
	// other go first: stop it a few times.
	for i := range 3 {
		prefix := unique("quiet")
		root := testdir.Short(t, "vn")
		cfg := filepath.Join(root, "plugin.yaml")
		res := corev1.ResourceName("e2e.dpkit.io/" + prefix)
		writeFile(t, cfg, fmt.Sprintf("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: %s\n      count: 2\n", res))
		clk := clocktesting.NewFakeClock(time.Now())
		o := noderun.Options{
			Kubeconfig: cp.Kubeconfig, Name: prefix, Root: root, Backend: "sim", Port: -1, NodeIP: "127.0.0.1",
			Taints: []string{virtualnode.DefaultTaintKey + ":NoSchedule"}, CPU: "1", Memory: "1Gi", Pods: "10",
			Count: 2, QPS: 50, Burst: 100, PluginConfig: cfg, PluginClock: clk,
		}
		var logs syncbuf.Buffer
		log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
		ready := watchNodesReady(ctx, c, prefix+"-", 2, res, 2)
		nctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- noderun.Run(nctx, log, o, nil) }()
		select {
		case <-ready.done:
		case err := <-done:
			cancel()
			t.Fatalf("dpkit node exited: %v", err)
		case <-ctx.Done():
			cancel()
			t.Fatalf("%d of 2 nodes Ready with their devices: %v", ready.count(), ctx.Err())
		}
		ready.stop()
		clk.Step(time.Minute)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("stop %d: dpkit node returned %v", i, err)
		}
		if l := logs.String(); l != "" {
			t.Fatalf("stop %d: a clean stop logged:\n%s", i, l)
		}
	}
}
