package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode"
)

// TestVirtualNodeResourceMetrics reads /metrics/resource as metrics-server
// does for kubectl top (through the API server's node proxy, see
// newNodeAccess): a running process-backend pod has its container's and
// its own CPU time and working set, the node at least as much; /healthz,
// /configz and /runningpods/ answer the kubelet's way; the node's
// Hostname address is the machine's name.
func TestVirtualNodeResourceMetrics(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-top")
	access := newNodeAccess(t, cp)
	_, port := startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, func(o *noderun.Options) { o.NodeIP = access.ip })
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-top")

	runUntilRemoved(t, ctx, c, ns, "busy", name, root, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo busy done")
	waitLogs(t, ctx, c, ns, "busy", "busy done")

	var got map[string]float64
	poll(t, ctx, "the pod in /metrics/resource", func(ctx context.Context) (bool, string, error) {
		b, err := access.get(ctx, c, name, port, "metrics/resource")
		if err != nil {
			return false, err.Error(), nil
		}
		if got, err = resourceSamples(string(b)); err != nil {
			return false, "", err
		}
		_, ok := got[fmt.Sprintf("container_cpu_usage_seconds_total{container=app,namespace=%s,pod=busy}", ns)]
		return ok, string(b), nil
	})
	for _, k := range []string{
		fmt.Sprintf("container_cpu_usage_seconds_total{container=app,namespace=%s,pod=busy}", ns),
		fmt.Sprintf("container_memory_working_set_bytes{container=app,namespace=%s,pod=busy}", ns),
		fmt.Sprintf("container_start_time_seconds{container=app,namespace=%s,pod=busy}", ns),
		fmt.Sprintf("pod_cpu_usage_seconds_total{namespace=%s,pod=busy}", ns),
		fmt.Sprintf("pod_memory_working_set_bytes{namespace=%s,pod=busy}", ns),
		"node_cpu_usage_seconds_total{}", "node_memory_working_set_bytes{}",
	} {
		if got[k] <= 0 {
			t.Errorf("%s = %v, want more than 0", k, got[k])
		}
	}
	podCPU := got[fmt.Sprintf("pod_cpu_usage_seconds_total{namespace=%s,pod=busy}", ns)]
	if got["node_cpu_usage_seconds_total{}"] < podCPU {
		t.Errorf("node CPU %v below its pod's %v", got["node_cpu_usage_seconds_total{}"], podCPU)
	}
	if got["resource_scrape_error{}"] != 0 {
		t.Errorf("resource_scrape_error %v, want 0", got["resource_scrape_error{}"])
	}

	if b, err := access.get(ctx, c, name, port, "healthz"); err != nil || string(b) != "ok" {
		t.Errorf("healthz: %q, %v; want ok", b, err)
	}
	b, err := access.get(ctx, c, name, port, "configz")
	var cz struct {
		KubeletConfig struct {
			Kind           string `json:"kind"`
			Port           int    `json:"port"`
			Authentication struct {
				X509 struct {
					ClientCAFile string `json:"clientCAFile"`
				} `json:"x509"`
			} `json:"authentication"`
		} `json:"kubeletconfig"`
	}
	if err != nil || json.Unmarshal(b, &cz) != nil || cz.KubeletConfig.Kind != "KubeletConfiguration" ||
		cz.KubeletConfig.Port != port || cz.KubeletConfig.Authentication.X509.ClientCAFile != cp.ClientCAFile {
		t.Errorf("configz: %s, %v; want the node's port %d and client CA", b, err, port)
	}
	b, err = access.get(ctx, c, name, port, "runningpods/")
	var running corev1.PodList
	if err != nil || json.Unmarshal(b, &running) != nil || len(running.Items) != 1 || running.Items[0].Name != "busy" {
		t.Errorf("runningpods: %s, %v; want the one running pod", b, err)
	}

	node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeHostName && a.Address != virtualnode.DefaultHostname() {
			t.Errorf("Hostname address %q, want the machine's %q", a.Address, virtualnode.DefaultHostname())
		}
	}
}

// resourceSamples parses a text exposition into name{label=value,...}
// (labels sorted) -> value; a usage sample without a timestamp is an error,
// as metrics-server needs them.
func resourceSamples(body string) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("parsing %q: %w", body, err)
	}
	out := map[string]float64{}
	for name, mf := range families {
		for _, m := range mf.Metric {
			var labels []string
			for _, l := range m.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			out[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if (strings.HasSuffix(name, "_usage_seconds_total") || strings.HasSuffix(name, "_working_set_bytes")) && m.TimestampMs == nil {
				return nil, fmt.Errorf("%s has no timestamp", key)
			}
		}
	}
	return out, nil
}

// syncBuffer is a bytes buffer safe for one writer and readers, which
// closes seen once it holds want.
type syncBuffer struct {
	mu   sync.Mutex
	b    strings.Builder
	want string
	seen chan struct{}
	once sync.Once
}

func newSyncBuffer(want string) *syncBuffer {
	return &syncBuffer{want: want, seen: make(chan struct{})}
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Write(p)
	if strings.Contains(s.b.String(), s.want) {
		s.once.Do(func() { close(s.seen) })
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestVirtualNodeAttach attaches to a running process-backend pod through
// the API server as kubectl attach does (WebSocket with SPDY as fallback,
// and SPDY alone): what the container prints from then on comes back,
// stdout and stderr apart, and the session ends when the container exits.
func TestVirtualNodeAttach(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-attach")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-attach")

	for _, mode := range []string{"websocket", "spdy"} {
		t.Run(mode, func(t *testing.T) {
			pod := "attach-" + mode
			stop := filepath.Join(root, "stop-"+mode)
			script := fmt.Sprintf("echo before; while [ ! -e %s ]; do echo tick; echo tock >&2; sleep 0.1; done; echo bye", stop)
			if _, err := c.CoreV1().Pods(ns).Create(ctx, devicePod(ns, pod, name, "1", []string{"sh", "-c", script}), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitLogs(t, ctx, c, ns, pod, "before")
			stdout, stderr, done := attachUntilTickTock(t, ctx, cp.RESTConfig, mode, ns, pod)
			if err := os.WriteFile(stop, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("attach: %v", err)
			}
			out, errOut := stdout.String(), stderr.String()
			if strings.Contains(out, "before") || strings.Contains(out, "tock") || !strings.HasSuffix(out, "bye\n") {
				t.Errorf("attach stdout %q, want tick lines then bye, nothing printed before the attach", out)
			}
			if strings.Contains(errOut, "tick") || strings.Trim(strings.ReplaceAll(errOut, "tock\n", ""), "\n") != "" {
				t.Errorf("attach stderr %q, want tock lines only", errOut)
			}
		})
	}
}

// attachToPod attaches to the container app of pod until it ends.
func attachToPod(ctx context.Context, cfg *rest.Config, mode, ns, pod string, stdout, stderr io.Writer) error {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	req := c.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("attach").
		VersionedParams(&corev1.PodAttachOptions{Container: "app", Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return err
	}
	if mode == "websocket" {
		ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
		if err != nil {
			return err
		}
		if ex, err = remotecommand.NewFallbackExecutor(ws, ex, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		}); err != nil {
			return err
		}
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
}

// TestVirtualNodePortForward forwards a local port to a process-backend
// pod's port through the API server as kubectl port-forward does (SPDY
// over WebSocket with SPDY as fallback, and SPDY alone): an HTTP server the
// pod runs on the host's port answers through it.
func TestVirtualNodePortForward(t *testing.T) {
	server := httpServerCommand(t)
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-pf")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-pf")

	podPort := freePort(t)
	www := filepath.Join(root, "www")
	if err := os.MkdirAll(www, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(www, "index.html"), []byte("served by the pod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	runUntilRemoved(t, ctx, c, ns, "web", name, root, fmt.Sprintf(server, podPort, www)+" & echo started")
	waitLogs(t, ctx, c, ns, "web", "started")

	for _, mode := range []string{"websocket", "spdy"} {
		t.Run(mode, func(t *testing.T) {
			local := forwardPort(t, ctx, cp.RESTConfig, mode, ns, "web", podPort)
			// The server may still be starting.
			body := pollHTTP(t, ctx, "the pod's server through the forwarded port", fmt.Sprintf("http://127.0.0.1:%d/index.html", local))
			if body != "served by the pod\n" {
				t.Errorf("through the forwarded port: %q, want the pod's page", body)
			}
		})
	}
}

// httpServerCommand is a shell command serving a directory over HTTP on
// 127.0.0.1 (format arguments: port, directory): busybox httpd or
// Python's http.server, whichever the machine has.
func httpServerCommand(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("busybox"); err == nil {
		return "busybox httpd -f -p 127.0.0.1:%d -h %s"
	}
	if _, err := exec.LookPath("python3"); err == nil {
		return "exec python3 -m http.server --bind 127.0.0.1 %d --directory %s"
	}
	t.Fatal("the port-forward test needs an HTTP server for its pod: install busybox or python3")
	return ""
}

// forwardPort forwards a free local port to the pod's port until the test
// ends, and returns the local port.
func forwardPort(t *testing.T, ctx context.Context, cfg *rest.Config, mode, ns, pod string, port int) int {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := c.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	if mode == "websocket" {
		ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
		if err != nil {
			t.Fatal(err)
		}
		dialer = portforward.NewFallbackDialerForStreaming(ws, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{"0:" + strconv.Itoa(port)}, stop, ready, io.Discard, tWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	t.Cleanup(func() {
		close(stop)
		if err := <-done; err != nil {
			t.Errorf("port-forward: %v", err)
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("port-forward: %v", err)
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		t.Fatalf("forwarded ports %v, %v", ports, err)
	}
	return int(ports[0].Local)
}

// pollHTTP GETs url until it answers 200 (a server in a pod may still be
// starting) and returns the body of that answer.
func pollHTTP(t *testing.T, ctx context.Context, what, url string) string {
	t.Helper()
	var body string
	poll(t, ctx, what, func(ctx context.Context) (bool, string, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, "", err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error(), nil
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err == nil && resp.StatusCode == http.StatusOK, resp.Status + " " + body, nil
	})
	return body
}

// attachUntilTickTock attaches to pod, whose container prints tick lines
// on stdout and tock lines on stderr, and returns once one of each came
// through the attach, with the streams and the attach's end.
func attachUntilTickTock(t *testing.T, ctx context.Context, rc *rest.Config, mode, ns, pod string) (stdout, stderr *syncBuffer, done <-chan error) {
	t.Helper()
	stdout, stderr = newSyncBuffer("tick\n"), newSyncBuffer("tock\n")
	ended := make(chan error, 1)
	go func() { ended <- attachToPod(ctx, rc, mode, ns, pod, stdout, stderr) }()
	for _, b := range []*syncBuffer{stdout, stderr} {
		select {
		case <-b.seen:
		case err := <-ended:
			t.Fatalf("attach ended before the container printed %q: %v (stdout %q, stderr %q)", b.want, err, stdout, stderr)
		}
	}
	return stdout, stderr, ended
}
