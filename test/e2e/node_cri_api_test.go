package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// criPod is a busybox pod on node running script, never restarted.
func criPod(ns, name, node, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			Tolerations:                   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: ptr(int64(1)),
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", script},
			}},
		},
	}
}

// startCRIPod creates a criPod and waits until it runs.
func startCRIPod(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name, node, script string) {
	t.Helper()
	if _, err := c.CoreV1().Pods(ns).Create(ctx, criPod(ns, name, node, script), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, ns, name)
		}
	})
	waitPod(t, ctx, c, ns, name, "Running on "+node, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
}

// TestVirtualNodeCRIStreams: what the node API serves for a cri-backed
// node's pods, through the API server as kubectl and metrics-server reach
// it: /metrics/resource and /stats/summary measure a busy container from
// the runtime's stats; attach shows what a container prints from then on
// and gives a container with stdin: true what the session sends; port-forward
// reaches a server listening in the pod's network namespace; logs -f
// follows a container's log as it grows and ends when the container does;
// a sandbox the runtime fails to create gives the kubelet's event and is
// tried again.
func TestVirtualNodeCRIStreams(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-api")
	access := newNodeAccess(t, cp)
	port := freePort(t)
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, access.ip, port)
	rtm.use(&o)
	runNode(t, ctx, o)
	ns := createNamespace(t, c, "vncri-api")

	t.Run("metrics", func(t *testing.T) {
		ctx := testContext(t)
		startCRIPod(t, ctx, c, ns, "busy", name, "while true; do i=$((i+1)); done")
		keys := []string{
			fmt.Sprintf("container_cpu_usage_seconds_total{container=app,namespace=%s,pod=busy}", ns),
			fmt.Sprintf("container_memory_working_set_bytes{container=app,namespace=%s,pod=busy}", ns),
			fmt.Sprintf("container_start_time_seconds{container=app,namespace=%s,pod=busy}", ns),
			fmt.Sprintf("pod_cpu_usage_seconds_total{namespace=%s,pod=busy}", ns),
			fmt.Sprintf("pod_memory_working_set_bytes{namespace=%s,pod=busy}", ns),
			"node_cpu_usage_seconds_total{}", "node_memory_working_set_bytes{}",
		}
		var got map[string]float64
		poll(t, ctx, "the busy pod's usage in /metrics/resource", func(ctx context.Context) (bool, string, error) {
			b, err := access.get(ctx, c, name, port, "metrics/resource")
			if err != nil {
				return false, err.Error(), nil
			}

			if got, err = resourceSamples(string(b)); err != nil {
				return false, "", err
			}
			for _, k := range keys {
				if got[k] <= 0 {
					return false, string(b), nil
				}
			}
			return true, "", nil
		})
		for _, k := range keys {
			t.Logf("%s %v", k, got[k])
		}
		if got["resource_scrape_error{}"] != 0 {
			t.Errorf("resource_scrape_error %v, want 0", got["resource_scrape_error{}"])
		}
		podCPU := got[fmt.Sprintf("pod_cpu_usage_seconds_total{namespace=%s,pod=busy}", ns)]
		if got["node_cpu_usage_seconds_total{}"] < podCPU {
			t.Errorf("node CPU %v below its pod's %v", got["node_cpu_usage_seconds_total{}"], podCPU)
		}
		// The stats summary has the pod's usage in cores too, the busy
		// loop's from two samples at the latest.
		poll(t, ctx, "the busy pod's usage in cores in /stats/summary", func(ctx context.Context) (bool, string, error) {
			b, err := access.get(ctx, c, name, port, "stats/summary")
			if err != nil {
				return false, err.Error(), nil
			}
			var s statsv1alpha1.Summary
			if err := json.Unmarshal(b, &s); err != nil {
				return false, "", err
			}
			for _, p := range s.Pods {
				if p.PodRef.Name != "busy" || p.PodRef.Namespace != ns || p.CPU == nil || len(p.Containers) != 1 {
					continue
				}
				cs := p.Containers[0]
				ok := cs.Name == "app" && cs.CPU != nil && cs.CPU.UsageNanoCores != nil && *cs.CPU.UsageNanoCores > 0 &&
					p.CPU.UsageNanoCores != nil && *p.CPU.UsageNanoCores > 0
				return ok, string(b), nil
			}
			return false, string(b), nil
		})
		if err := c.CoreV1().Pods(ns).Delete(ctx, "busy", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
			t.Fatal(err)
		}
	})

	for _, mode := range []string{"websocket", "spdy"} {
		t.Run("attach-"+mode, func(t *testing.T) {
			ctx := testContext(t)
			pod := "attach-" + mode
			startCRIPod(t, ctx, c, ns, pod, name, "echo before; while [ ! -e /tmp/stop ]; do echo tick; echo tock >&2; sleep 0.1; done; echo bye")
			waitLogs(t, ctx, c, ns, pod, "before")
			stdout, stderr, done := attachUntilTickTock(t, ctx, cp.RESTConfig, mode, ns, pod)
			if out, errOut, err := execInPod(ctx, cp.RESTConfig, mode, ns, pod, []string{"touch", "/tmp/stop"}, ""); err != nil {
				t.Fatalf("exec touch /tmp/stop: %v (%q %q)", err, out, errOut)
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

	// A container with stdin: true reads what the attach session sends;
	// with tty: true too, through its terminal, which echoes the input
	// and ends lines with CR LF.
	//
	// The runtime starts copying the session's stdin into the container
	// a moment before it adds the session to the container's output (as
	// containerd does for the kubelet too), so the answer to a line sent
	// at once can go only to the log. The container answers every line
	// and the test sends its line again until an answer comes back: the
	// session has the container's output from then on.
	for _, tty := range []bool{false, true} {
		pod, answer, want := "reader", "got hello\n", "got hello\n"
		if tty {
			pod, answer, want = "reader-tty", "got hello\r\n", "hello\r\ngot hello\r\n"
		}
		t.Run("attach-stdin-"+map[bool]string{false: "pipe", true: "tty"}[tty], func(t *testing.T) {
			ctx := testContext(t)
			p := criPod(ns, pod, name, `echo ready; while read line; do echo "got $line"; done`)
			p.Spec.Containers[0].Stdin, p.Spec.Containers[0].TTY = true, tty
			if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitLogs(t, ctx, c, ns, pod, "ready")
			req := c.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("attach").
				VersionedParams(&corev1.PodAttachOptions{Container: "app", Stdin: true, Stdout: true, Stderr: !tty, TTY: tty}, scheme.ParameterCodec)
			ex, err := remotecommand.NewSPDYExecutor(cp.RESTConfig, "POST", req.URL())
			if err != nil {
				t.Fatal(err)
			}
			// The session ends when its stdin does (containerd detaches a
			// client whose stdin closes unless stdinOnce): stdin stays
			// open until the answer arrives.
			in, toStdin := io.Pipe()
			stdout, stderr := newSyncBuffer(want), newSyncBuffer("")
			opts := remotecommand.StreamOptions{Stdin: in, Stdout: stdout, Tty: tty}
			if !tty {
				opts.Stderr = stderr
			}
			done := make(chan error, 1)
			go func() { done <- ex.StreamWithContext(ctx, opts) }()
			sent := make(chan error, 1)
			send := func() { go func() { _, err := toStdin.Write([]byte("hello\n")); sent <- err }() }
			send()
			again := time.NewTicker(250 * time.Millisecond)
			defer again.Stop()
			deadline := time.NewTimer(30 * time.Second)
			defer deadline.Stop()
			pending := true
		wait:
			for {
				select {
				case <-stdout.seen:
					break wait
				case err := <-sent:
					if err != nil {
						t.Fatalf("writing to the session's stdin: %v", err)
					}
					pending = false
				case <-again.C:
					if !pending {
						pending = true
						send()
					}
				case err := <-done:
					t.Fatalf("attach ended before the container answered: %v (stdout %q, stderr %q)", err, stdout, stderr)
				case <-deadline.C:
					t.Fatalf("no answer to stdin in 30s: stdout %q, stderr %q", stdout, stderr)
				}
			}
			toStdin.Close()
			if err := <-done; err != nil {
				t.Fatalf("attach: %v", err)
			}
			// Only answers come back (and, through a terminal, its echo of
			// each line): stdin reached the container, its output the
			// session, nothing else.
			got := stdout.String()
			rest := strings.ReplaceAll(got, answer, "")
			if tty {
				rest = strings.ReplaceAll(rest, "hello\r\n", "")
			}
			if rest != "" || !strings.Contains(got, want) {
				t.Errorf("attach with stdin (tty %v): stdout %q, want %q, perhaps repeated", tty, got, want)
			}
			if s := stderr.String(); s != "" {
				t.Errorf("attach with stdin: stderr %q, want nothing", s)
			}
		})
	}

	t.Run("port-forward", func(t *testing.T) {
		ctx := testContext(t)
		startCRIPod(t, ctx, c, ns, "web", name, "mkdir -p /tmp/www && echo 'served by the cri pod' > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www")
		for _, mode := range []string{"websocket", "spdy"} {
			local := forwardPort(t, ctx, cp.RESTConfig, mode, ns, "web", 8080)
			// The server may still be starting.
			body := pollHTTP(t, ctx, mode+": the pod's server through the forwarded port", fmt.Sprintf("http://127.0.0.1:%d/index.html", local))
			if body != "served by the cri pod\n" {
				t.Errorf("%s: through the forwarded port: %q, want the pod's page", mode, body)
			}
		}
	})

	t.Run("logs-follow", func(t *testing.T) {
		ctx := testContext(t)
		startCRIPod(t, ctx, c, ns, "count", name, `i=0; while [ ! -e /tmp/stop ]; do i=$((i+1)); echo "line $i"; sleep 0.2; done; echo bye`)
		before := waitLogs(t, ctx, c, ns, "count", "line 1\n")
		had := strings.Count(before, "\n")
		rc, err := c.CoreV1().Pods(ns).GetLogs("count", &corev1.PodLogOptions{Container: "app", Follow: true}).Stream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		lines := make(chan string)
		ended := make(chan error, 1)
		go func() {
			sc := bufio.NewScanner(rc)
			for sc.Scan() {
				select {
				case lines <- sc.Text():
				case <-ctx.Done():
				}
			}
			ended <- sc.Err()
		}()
		var got []string
		next := func() (string, bool) {
			select {
			case l := <-lines:
				got = append(got, l)
				return l, true
			case err := <-ended:
				t.Fatalf("the follow stream ended (%v) after %q, want more lines", err, got)
			case <-ctx.Done():
				t.Fatalf("%v after %q", ctx.Err(), got)
			}
			return "", false
		}
		// Lines printed after the stream opened arrive in it.
		for {
			l, _ := next()
			if n, err := strconv.Atoi(strings.TrimPrefix(l, "line ")); err == nil && n > had+3 {
				break
			}
		}
		if out, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, "count", []string{"touch", "/tmp/stop"}, ""); err != nil {
			t.Fatalf("exec touch /tmp/stop: %v (%q %q)", err, out, errOut)
		}
		// The stream ends when the container does, bye its last line.
		deadline := time.NewTimer(time.Minute)
		defer deadline.Stop()
	follow:
		for {
			select {
			case l := <-lines:
				got = append(got, l)
			case err := <-ended:
				if err != nil {
					t.Errorf("the follow stream: %v", err)
				}
				break follow
			case <-deadline.C:
				t.Fatalf("the follow stream did not end with the container; read %q", got)
			}
		}
		if len(got) == 0 || got[len(got)-1] != "bye" {
			t.Fatalf("followed %q, want bye last", got)
		}
		for i, l := range got[:len(got)-1] {
			if l != fmt.Sprintf("line %d", i+1) {
				t.Fatalf("followed line %d %q, want every line once, in order: %q", i+1, l, got)
			}
		}
		t.Logf("followed %d lines, %d of them before the stream opened", len(got), had)
	})

	// The runtime cannot create a sandbox while its CNI configuration is
	// gone: the kubelet's FailedCreatePodSandBox event, the pod Pending;
	// once the configuration is back, the next try creates it.
	t.Run("sandbox-failure", func(t *testing.T) {
		ctx := testContext(t)
		conf := filepath.Join(rtm.dir, "cni", "10-dpkit-cri.conflist")
		saved, err := os.ReadFile(conf)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(conf); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(conf, saved, 0o644) })
		if _, err := c.CoreV1().Pods(ns).Create(ctx, criPod(ns, "nonet", name, "echo up; sleep 3600"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		var msg string
		poll(t, ctx, "a FailedCreatePodSandBox event for the pod", func(ctx context.Context) (bool, string, error) {
			evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=nonet,reason=FailedCreatePodSandBox"})
			if err != nil {
				return false, err.Error(), nil
			}
			for _, e := range evs.Items {
				msg = e.Message
				return e.Type == corev1.EventTypeWarning && strings.HasPrefix(e.Message, "Failed to create pod sandbox: "), e.Message, nil
			}
			return false, "no event", nil
		})
		t.Logf("event: %s", msg)
		p, err := c.CoreV1().Pods(ns).Get(ctx, "nonet", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("phase %s while the sandbox fails, want Pending", p.Status.Phase)
		}
		if err := os.WriteFile(conf, saved, 0o644); err != nil {
			t.Fatal(err)
		}
		waitPod(t, ctx, c, ns, "nonet", "Running once the runtime's CNI configuration is back", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
		})
	})
}
