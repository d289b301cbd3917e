package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/cri"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/process"
)

const foo = corev1.ResourceName("example.com/foo")

// startVirtualNode runs "dpkit node" in-process with the process backend
// against the shared control plane and waits until it is registered.
func startVirtualNode(t *testing.T, ctx context.Context, kubeconfig, clientCA, name, root string, extra func(*noderun.Options)) (*virtualnode.Node, int) {
	t.Helper()
	o := nodeOptions(kubeconfig, clientCA, name, root, "127.0.0.1", freePort(t))
	if extra != nil {
		extra(&o)
	}
	n, _ := runNode(t, ctx, o)
	return n, o.Port
}

// nodeOptions are the options of "dpkit node" the e2e tests use: the
// process backend, the default taint, a small declared capacity.
func nodeOptions(kubeconfig, clientCA, name, root, nodeIP string, port int) noderun.Options {
	return noderun.Options{
		Kubeconfig: kubeconfig, Name: name, Root: root, Backend: "process", ClientCAFile: clientCA,
		Port: port, NodeIP: nodeIP, Taints: []string{virtualnode.DefaultTaintKey + ":NoSchedule"},
		CPU: "4", Memory: "8Gi", Pods: "110", Count: 1, QPS: 50, Burst: 100, BackoffStart: time.Second,
	}
}

// runNode runs "dpkit node" in-process until it has registered, and
// returns the node and a function that stops it and waits until it has
// returned; the test's cleanup stops it too.
func runNode(t *testing.T, ctx context.Context, o noderun.Options) (*virtualnode.Node, func()) {
	t.Helper()
	nctx, cancel := context.WithCancel(ctx)
	started := make(chan *virtualnode.Node, 1)
	done := make(chan error, 1)
	env := &cli.Env{In: strings.NewReader(""), Out: tWriter{t}, Err: tWriter{t}, Logger: testLogger(t)}
	go func() {
		done <- noderun.Run(nctx, env.Logger, o, func(ns []*virtualnode.Node) { started <- ns[0] })
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("dpkit node: %v", err)
			}
		})
	}
	afterNodeStops(t, o)
	t.Cleanup(stop)
	select {
	case n := <-started:
		return n, stop
	case err := <-done:
		t.Fatalf("dpkit node exited before it ran: %v", err)
	case <-ctx.Done():
		t.Fatalf("dpkit node did not start: %v", ctx.Err())
	}
	return nil, nil
}

// afterNodeStops registers what a test does once the dpkit node it runs
// with o has stopped; register it before the cleanup that stops the node
// (cleanups run last first). A stopped node keeps its pods for the next
// node on the root to adopt, as a kubelet keeps its containers: the
// process backend's processes, the cri backend's volumes (memory-backed
// ones, subPath bind mounts). The test ends them.
func afterNodeStops(t *testing.T, o noderun.Options) {
	t.Helper()
	switch o.Backend {
	case "process":
		t.Cleanup(func() { stopProcessPods(t, o.Root) })
	case "cri":
		t.Cleanup(func() {
			if err := cri.UnmountPods(filepath.Join(o.Root, "pods")); err != nil {
				t.Errorf("unmount the volumes the node left: %v", err)
			}
		})
	}
}

// stopProcessPods ends the processes of the pods that the process
// backends under root (the node's, or each node's of a --count) left.
func stopProcessPods(t *testing.T, root string) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(root, "*", "pods"))
	dirs = append(dirs, filepath.Join(root, "pods"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, d := range dirs {
		stopped, err := process.StopPods(ctx, d, 5*time.Second)
		if err != nil {
			t.Errorf("stop the pods the node left running: %v", err)
		}
		if len(stopped) > 0 {
			t.Logf("the stopped node left pods running (kept for adoption); ended them: %v", stopped)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestVirtualNodeDevices is the must-show flow: a virtual node with the
// process backend, the fake device plugin registering with it, a pod that
// gets two devices, its logs through the API server, PodResources while it
// runs, devices freed after, an oversized pod left Pending and the node API
// refusing anonymous callers.
func TestVirtualNodeDevices(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn")

	n, port := startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)

	// Registered and Ready, start-up taint gone, our taint kept.
	poll(t, ctx, "node "+name+" Ready without the not-ready taint", func(ctx context.Context) (bool, string, error) {
		node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ready := false
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		var keys []string
		for _, tt := range node.Spec.Taints {
			keys = append(keys, tt.Key)
		}
		ok := ready && len(keys) == 1 && keys[0] == virtualnode.DefaultTaintKey && node.Status.DaemonEndpoints.KubeletEndpoint.Port == int32(port)
		return ok, fmt.Sprintf("ready %v taints %v endpoint %d", ready, keys, node.Status.DaemonEndpoints.KubeletEndpoint.Port), nil
	})
	if _, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Fatalf("node lease: %v", err)
	}

	// The fake device plugin registers with the node's device manager:
	// 8 example.com/foo in capacity and allocatable.
	startFakePlugin(t, ctx, c, name, root)

	ns := createNamespace(t, c, "vn")
	release := filepath.Join(root, "release")
	script := fmt.Sprintf("echo devices=$DPKIT_FAKE_DEVICES; while [ ! -e %s ]; do sleep 0.05; done; echo done", release)
	pod := devicePod(ns, "devices", name, "2", []string{"sh", "-c", script})
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, ctx, c, ns, "devices", "Running on "+name, func(p *corev1.Pod) bool {
		return p.Spec.NodeName == name && p.Status.Phase == corev1.PodRunning
	})

	// PodResources lists the pod and its two devices while it runs.
	prc := dialPodResources(t, ctx, root)
	var listed []string
	poll(t, ctx, "PodResources to list the pod's devices", func(ctx context.Context) (bool, string, error) {
		resp, err := prc.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			return false, "", err
		}
		listed = nil
		for _, p := range resp.PodResources {
			if p.Namespace != ns || p.Name != "devices" {
				continue
			}
			for _, ctr := range p.Containers {
				for _, d := range ctr.Devices {
					if d.ResourceName == string(foo) {
						listed = append(listed, d.DeviceIds...)
					}
				}
			}
		}
		return len(listed) == 2, fmt.Sprintf("%v", resp.PodResources), nil
	})

	// Logs through the API server while it runs (the API server's kubelet
	// client certificate is verified against --client-ca-file).
	var logs string
	poll(t, ctx, "the pod's first log line through the API server", func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs("devices", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, "devices="), logs, nil
	})

	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := waitPod(t, ctx, c, ns, "devices", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	if st := done.Status.ContainerStatuses; len(st) != 1 || st[0].State.Terminated == nil || st[0].State.Terminated.ExitCode != 0 || st[0].State.Terminated.Reason != "Completed" {
		t.Fatalf("container status %+v, want terminated with exit code 0 (Completed)", st)
	}
	_ = running

	b, err := c.CoreV1().Pods(ns).GetLogs("devices", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs through the API server: %v", err)
	}
	logs = string(b)
	m := regexp.MustCompile(`devices=(\S+)`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("logs %q: no devices= line", logs)
	}
	ids := strings.Split(m[1], ",")
	if len(ids) != 2 {
		t.Fatalf("logs show devices %q, want two IDs", m[1])
	}
	for _, id := range ids {
		if !strings.Contains(strings.Join(listed, ","), id) {
			t.Errorf("device %s from the logs is not among PodResources' %v", id, listed)
		}
	}
	if !strings.Contains(logs, "done\n") {
		t.Errorf("logs %q lack the last line", logs)
	}
	// timestamps and tail go through the node API too.
	b, err = c.CoreV1().Pods(ns).GetLogs("devices", &corev1.PodLogOptions{Container: "app", Timestamps: true, TailLines: ptr(int64(1))}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 1 || !strings.HasSuffix(lines[0], " done") {
		t.Errorf("tail=1 with timestamps: %q, want one timestamped line ending in done", b)
	} else if _, err := time.Parse(time.RFC3339Nano, strings.Fields(lines[0])[0]); err != nil {
		t.Errorf("tail=1 with timestamps: %q: %v", lines[0], err)
	}

	// Devices are free again once the pod ended.
	poll(t, ctx, "the pod's devices to be free", func(context.Context) (bool, string, error) {
		for _, r := range n.DeviceManager().Resources() {
			if r.Name == string(foo) {
				return r.InUse == 0, fmt.Sprintf("in use %d", r.InUse), nil
			}
		}
		return false, "example.com/foo unknown", nil
	})

	// More than allocatable: never scheduled.
	big := devicePod(ns, "too-many", name, "9", []string{"true"})
	if _, err := c.CoreV1().Pods(ns).Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, ctx, c, ns, "too-many", "FailedScheduling", "Insufficient example.com/foo")
	p, err := c.CoreV1().Pods(ns).Get(ctx, "too-many", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod asking for 9: node %q phase %s, want unbound and Pending", p.Spec.NodeName, p.Status.Phase)
	}

	// Anonymous callers are refused by the node API.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 10 * time.Second} //nolint:gosec // self-signed test server
	for _, path := range []string{"/exec/" + ns + "/devices/app?command=true&output=1", "/containerLogs/" + ns + "/devices/app", "/pods"} {
		method := http.MethodGet
		if strings.HasPrefix(path, "/exec") {
			method = http.MethodPost
		}
		req, _ := http.NewRequestWithContext(ctx, method, "https://127.0.0.1:"+strconv.Itoa(port)+path, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("anonymous %s %s: %d, want 401", method, path, resp.StatusCode)
		}
	}
}

// TestVirtualNodeAuthz checks 403 for an authenticated caller the API
// server does not authorize and 200 for the API server's own identity.
func TestVirtualNodeAuthz(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	root := testdir.Short(t, "vn")
	name := unique("vn-authz")
	_, port := startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)

	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/pods"
	for _, tc := range []struct {
		name   string
		user   string
		groups []string
		want   int
	}{
		{"unprivileged user", "nobody", nil, http.StatusForbidden},
		{"cluster admin", "admin", []string{"system:masters"}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			certFile, keyFile, err := cp.IssueClientCert(tc.user, tc.groups...)
			if err != nil {
				t.Fatal(err)
			}
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}, Timeout: 10 * time.Second} //nolint:gosec // self-signed
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("GET /pods as %s: %d, want %d", tc.user, resp.StatusCode, tc.want)
			}
		})
	}
}

func devicePod(ns, name, node, amount string, cmd []string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			NodeSelector:  map[string]string{"kubernetes.io/hostname": node},
			Tolerations:   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name:      "app",
				Image:     "none",
				Command:   cmd,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{foo: resource.MustParse(amount)}},
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// BenchmarkVirtualNodeSim measures pods reaching Running per second on a
// real control plane (API server + kube-scheduler) of its own: 10 virtual
// nodes with the sim backend in one process (shared informers), each with a
// fake device plugin serving 100 example.com/bench devices, and 1 000 pods
// each asking for one device (see runPodBench). It runs once with
// kube-scheduler's default client rate limit and once with it raised. Run
// with -benchtime=1x.
func BenchmarkVirtualNodeSim(b *testing.B) {
	for _, s := range benchSchedulers {
		b.Run(s.name, func(b *testing.B) {
			cp, c := benchControlPlane(b, s.qps, s.burst)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			root := testdir.Short(b, "vnb")
			prefix := unique("sim")
			o := noderun.Options{
				Kubeconfig: cp.Kubeconfig, Name: prefix, Root: root, Backend: "sim", Port: -1, NodeIP: "127.0.0.1",
				Taints: []string{virtualnode.DefaultTaintKey + ":NoSchedule"}, CPU: "1000", Memory: "1Ti", Pods: "1000",
				Count: benchNodes, QPS: 500, Burst: 1000,
			}
			nctx, ncancel := context.WithCancel(ctx)
			started := make(chan struct{})
			ndone := make(chan error, 1)
			env := &cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Logger: slog.New(slog.DiscardHandler)}
			go func() { ndone <- noderun.Run(nctx, env.Logger, o, func([]*virtualnode.Node) { close(started) }) }()
			defer func() { ncancel(); <-ndone }()
			select {
			case <-started:
			case err := <-ndone:
				b.Fatalf("dpkit node: %v", err)
			}
			cfgPath := filepath.Join(root, "bench.yaml")
			if err := os.WriteFile(cfgPath, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: example.com/bench\n      count: 100\n"), 0o600); err != nil {
				b.Fatal(err)
			}
			pctx, pcancel := context.WithCancel(ctx)
			var pwg sync.WaitGroup
			defer func() { pcancel(); pwg.Wait() }()
			for i := range benchNodes {
				pwg.Go(func() {
					var out, logs bytes.Buffer
					_ = app.Run(pctx, []string{"plugin", "--config", cfgPath, "--plugin-dir", filepath.Join(root, fmt.Sprintf("%s-%d", prefix, i), "device-plugins")}, strings.NewReader(""), &out, &logs)
				})
			}
			for i := range benchNodes {
				name := fmt.Sprintf("%s-%d", prefix, i)
				err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
					n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						return false, nil
					}
					q := n.Status.Allocatable[benchResource]
					return q.Value() == 100, nil
				})
				if err != nil {
					b.Fatalf("node %s never showed 100 example.com/bench: %v", name, err)
				}
			}
			runPodBench(b, cp, c, prefix, nil)
		})
	}
}

func createNamespaceTB(tb testing.TB, c kubernetes.Interface, base string) string {
	tb.Helper()
	name := unique(base)
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// dialPodResources dials the PodResources API of the node whose root is
// root; the connection is closed when the test ends.
func dialPodResources(t *testing.T, ctx context.Context, root string) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	prc, closer, err := prclient.Dial(ctx, podresources.SocketPath(root))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	return prc
}
