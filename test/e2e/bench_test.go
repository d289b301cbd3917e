package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// The pod-throughput benchmarks (BenchmarkVirtualNodeSim, BenchmarkKwokSim)
// share their shape: 10 nodes offering 100 example.com/bench each, 1 000
// pods asking for one each, created by 20 clients, timed until all are
// Running. See docs/performance.md.
const (
	benchNodes    = 10
	benchPods     = 1000
	benchWorkers  = 20
	benchResource = corev1.ResourceName("example.com/bench")
)

// benchSchedulers are the scheduler settings each pod-throughput benchmark
// runs with: kube-scheduler's default client rate limit (50 QPS, burst 100),
// which caps binding at about 50 pods a second, and one that does not limit
// 1 000 pods.
var benchSchedulers = []struct {
	name  string
	qps   float32
	burst int32
}{
	{"scheduler-qps=50", 0, 0},
	{"scheduler-qps=1000", 1000, 2000},
}

// benchControlPlane starts a control plane of the benchmark's own, so its
// scheduler settings and its objects are the benchmark's alone.
func benchControlPlane(b *testing.B, qps float32, burst int32) (*controlplane.ControlPlane, kubernetes.Interface) {
	b.Helper()
	return benchControlPlaneWith(b, controlplane.Options{Scheduler: true, SchedulerQPS: qps, SchedulerBurst: burst})
}

// benchControlPlaneWith is benchControlPlane with the control plane o
// says.
func benchControlPlaneWith(tb testing.TB, o controlplane.Options) (*controlplane.ControlPlane, kubernetes.Interface) {
	tb.Helper()
	cp := controlplane.StartForTest(tb, o)
	rc := *cp.RESTConfig
	rc.QPS, rc.Burst = 500, 1000
	c, err := kubernetes.NewForConfig(&rc)
	if err != nil {
		tb.Fatal(err)
	}
	return cp, c
}

// benchPod asks for one example.com/bench and tolerates dpkit's virtual
// node taint.
func benchPod(ns, name, label string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"bench": label}},
		Spec: corev1.PodSpec{
			Tolerations: []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "app", Image: "none",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{benchResource: resource.MustParse("1")}}}},
		},
	}
}

// runPodBench is the timed part of a pod-throughput benchmark, once per
// b.N: create benchPods pods in a new namespace and wait, through a watch,
// until every one is Running. It reports
//
//	pods_running/s      pods / (creation start -> last pod Running)
//	create_s            time to create the pods
//	all_bound_s         creation start -> last pod bound by the scheduler
//	all_running_s       creation start -> last pod Running
//	bound_to_running_p50_ms, _p99_ms  per pod, bound -> Running as seen by the watch
//	sched_ratelimit_wait_avg_s        kube-scheduler's mean wait in its client
//	                    rate limiter per POST (bindings, events): the scheduler cap
//	<name>_cpu_s        CPU seconds each process used while timed: etcd,
//	                    kube-apiserver, kube-scheduler, the processes in extra
//	                    and "bench" (this test process: the client, and for
//	                    dpkit the virtual nodes and plugins)
//	machine_cpu_s       CPU seconds the whole machine used while timed; the
//	                    rest of it is other load
func runPodBench(b *testing.B, cp *controlplane.ControlPlane, c kubernetes.Interface, label string, extra map[string]int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pids := map[string]int{"bench": os.Getpid()}
	for name, pid := range cp.PIDs() {
		pids[name] = pid
	}
	for name, pid := range extra {
		pids[name] = pid
	}
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		ns := createNamespaceTB(b, c, "bench")
		w := watchPods(ctx, c, ns, benchPods)
		cpu0, machine0 := cpuSeconds(pids), machineCPUSeconds()
		b.StartTimer()

		start := time.Now()
		createPods(b, ctx, c, ns, benchPods, func(i int) *corev1.Pod { return benchPod(ns, fmt.Sprintf("p%d", i), label) })
		created := time.Since(start)
		w.wait(b, ctx, "pods")

		b.StopTimer()
		cpu1, machine1 := cpuSeconds(pids), machineCPUSeconds()
		w.stop()
		elapsed := w.lastRunning.Sub(start)
		b.ReportMetric(float64(benchPods)/elapsed.Seconds(), "pods_running/s")
		b.ReportMetric(created.Seconds(), "create_s")
		b.ReportMetric(w.lastBound.Sub(start).Seconds(), "all_bound_s")
		b.ReportMetric(elapsed.Seconds(), "all_running_s")
		lags := w.lags()
		b.ReportMetric(float64(lags[len(lags)/2].Milliseconds()), "bound_to_running_p50_ms")
		b.ReportMetric(float64(lags[len(lags)*99/100].Milliseconds()), "bound_to_running_p99_ms")
		for name, t := range cpu1 {
			b.ReportMetric(t-cpu0[name], strings.TrimPrefix(name, "kube-")+"_cpu_s")
		}
		if machine0 > 0 {
			b.ReportMetric(machine1-machine0, "machine_cpu_s")
		}
		if avg, err := schedulerRateLimitWait(ctx, cp); err != nil {
			b.Logf("kube-scheduler rate limiter metric: %v", err)
		} else {
			b.ReportMetric(avg, "sched_ratelimit_wait_avg_s")
		}
		// Free the nodes for the next round.
		if err := c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{}); err != nil {
			b.Fatal(err)
		}
		if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
			l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil && len(l.Items) == 0, nil
		}); err != nil {
			b.Fatalf("pods of %s not deleted: %v", ns, err)
		}
		b.StartTimer()
	}
}

// createPods creates n pods of ns, pod(i) for each i, from benchWorkers
// clients at once.
func createPods(tb testing.TB, ctx context.Context, c kubernetes.Interface, ns string, n int, pod func(i int) *corev1.Pod) {
	tb.Helper()
	jobs := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range benchWorkers {
		wg.Go(func() {
			for i := range jobs {
				if _, err := c.CoreV1().Pods(ns).Create(ctx, pod(i), metav1.CreateOptions{}); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if failed.Load() > 0 {
		tb.Fatalf("%d pods could not be created", failed.Load())
	}
}

// podWatch records when each pod of a namespace is first seen bound and
// first seen Running.
type podWatch struct {
	stop func()
	done chan struct{}
	want int

	mu                     sync.Mutex
	bound, running         map[string]time.Time
	lastBound, lastRunning time.Time
}

// watchPods closes done once want pods of ns have been seen Running.
func watchPods(ctx context.Context, c kubernetes.Interface, ns string, want int) *podWatch {
	w := &podWatch{done: make(chan struct{}), want: want, bound: map[string]time.Time{}, running: map[string]time.Time{}}
	see := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, seen := w.bound[p.Name]; !seen && p.Spec.NodeName != "" {
			w.bound[p.Name], w.lastBound = now, now
		}
		if _, seen := w.running[p.Name]; !seen && p.Status.Phase == corev1.PodRunning {
			w.running[p.Name], w.lastRunning = now, now
			if len(w.running) == want {
				close(w.done)
			}
		}
	}
	w.stop = seePods(ctx, c, ns, see)
	return w
}

// seePods calls see with every pod of ns as it is added or changes, from
// an informer that runs until the returned stop is called; it returns
// once the informer has listed them.
func seePods(ctx context.Context, c kubernetes.Interface, ns string, see func(obj any)) (stop func()) {
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithNamespace(ns))
	inf := f.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, obj any) { see(obj) }})
	ctx, cancel := context.WithCancel(ctx)
	f.StartWithContext(ctx)
	f.WaitForCacheSync(ctx.Done())
	return func() { cancel(); f.Shutdown() }
}

// wait returns once the pods are all Running, and fails tb when ctx ends
// first, saying how many of the pods (what) were bound and Running.
func (w *podWatch) wait(tb testing.TB, ctx context.Context, what string) {
	tb.Helper()
	select {
	case <-w.done:
	case <-ctx.Done():
		w.mu.Lock()
		bound, running := len(w.bound), len(w.running)
		w.mu.Unlock()
		tb.Fatalf("%d of %d %s bound, %d Running: %v", bound, w.want, what, running, ctx.Err())
	}
}

// lags returns, sorted, how long each pod took from bound to Running.
func (w *podWatch) lags() []time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []time.Duration
	for name, r := range w.running {
		if bt, ok := w.bound[name]; ok {
			out = append(out, r.Sub(bt))
		}
	}
	slices.Sort(out)
	return out
}

// cpuSeconds returns the user+system CPU seconds each process has used,
// from /proc/PID/stat; processes it cannot read are left out.
func cpuSeconds(pids map[string]int) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses:
		// state is field 3, utime 14, stime 15.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		out[name] = (utime + stime) / clockTicks
	}
	return out
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// architecture Go supports.
const clockTicks = 100

// machineCPUSeconds returns the CPU seconds all CPUs have spent busy (not
// idle or waiting for I/O), from /proc/stat, or 0 when it cannot be read.
func machineCPUSeconds() float64 {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0
	}
	fields := strings.Fields(sc.Text()) // cpu user nice system idle iowait irq softirq steal ...
	var busy float64
	for i, v := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		n, _ := strconv.ParseFloat(v, 64)
		busy += n
	}
	return busy / clockTicks
}

// schedulerRateLimitWait reads kube-scheduler's /metrics and returns the mean
// time its POST requests (bindings, events) waited in the client-side rate
// limiter.
func schedulerRateLimitWait(ctx context.Context, cp *controlplane.ControlPlane) (float64, error) {
	certFile, keyFile, err := cp.IssueClientCert("bench-metrics", "system:masters")
	if err != nil {
		return 0, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return 0, err
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}, Timeout: 10 * time.Second} //nolint:gosec // the scheduler's self-signed serving certificate
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cp.SchedulerURL+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var sum, count float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.Contains(rest, `verb="POST"`) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			continue
		}
		switch name {
		case "rest_client_rate_limiter_duration_seconds_sum":
			sum += v
		case "rest_client_rate_limiter_duration_seconds_count":
			count += v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if count == 0 {
		return 0, fmt.Errorf("no rest_client_rate_limiter_duration_seconds for POST")
	}
	return sum / count, nil
}
