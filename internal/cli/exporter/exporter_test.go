package exporter_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/pkg/podresources"
)

type onePod struct{ pod *corev1.Pod }

func (p onePod) GetActivePods() []*corev1.Pod { return []*corev1.Pod{p.pod} }
func (p onePod) GetPodByName(ns, name string) (*corev1.Pod, bool) {
	return p.pod, p.pod.Namespace == ns && p.pod.Name == name
}

type gpus struct{}

func (gpus) GetDevices(string, string) []*podresourcesv1.ContainerDevices {
	return []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu0"}}}
}

func (gpus) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	return []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu0", "gpu1"}}}
}

// TestExporterServes runs dpkit exporter against a PodResources socket:
// /metrics has the pod's device, and the command stops cleanly.
func TestExporterServes(t *testing.T) {
	t.Parallel()
	socket := filepath.Join(t.TempDir(), "kubelet.sock")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainer", UID: "u1"}}
	pod.Spec.Containers = []corev1.Container{{Name: "main"}}
	srv, err := podresources.NewServer(podresources.Config{Providers: podresources.Providers{Pods: onePod{pod}, Devices: gpus{}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, socket) }()

	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, []string{"exporter", "--pod-resources-socket", socket, "--listen", "127.0.0.1:0", "--sysfs-root", ""}, nil, io.Discard, pw)
		_ = pw.Close()
	}()
	addr := ""
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if m := regexp.MustCompile(`msg="Serving device metrics" .*address=(\S+)`).FindStringSubmatch(sc.Text()); m != nil {
			addr = m[1]
			break
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	if addr == "" {
		t.Fatalf("no address logged; the command ended: %v", <-done)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	for _, want := range []string{
		`dpkit_pod_device_allocated{claim="",claim_namespace="",container="main",device="",device_id="gpu0",driver="",namespace="default",numa_node="",pod="trainer",pool="",resource="example.com/gpu",share=""} 1`,
		`dpkit_node_resource_allocatable{resource="example.com/gpu"} 2`,
		`dpkit_exporter_podresources_up 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics has no %s:\n%s", want, body)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("exporter stopped with %v", err)
	}
	<-served
}

// TestExporterUsageErrors: what is wrong with the command line is said
// before anything is served, naming the flag.
func TestExporterUsageErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		opts []app.Option
		want string
	}{
		"labels without the API": {[]string{"--pod-label", "app"}, nil, "--pod-label: pod labels come from the API server; give --kubeconfig too"},
		"no node name":           {[]string{"--kubeconfig", ""}, []app.Option{app.WithCluster(nodePods{})}, "--node-name: required with --kubeconfig"},
		"an empty socket":        {[]string{"--pod-resources-socket", ""}, nil, "--pod-resources-socket must not be empty"},
		"a bad listen address":   {[]string{"--listen", "nowhere:-1"}, nil, "--listen nowhere:-1"},
		"colliding pod labels":   {[]string{"--kubeconfig", "", "--node-name", "n", "--pod-label", "a.b", "--pod-label", "a_b"}, []app.Option{app.WithCluster(nodePods{})}, `"a.b" and "a_b" are both the metric label label_a_b`},
		"a kubeconfig not found": {[]string{"--kubeconfig", "/no/such", "--node-name", "n"}, []app.Option{app.WithCluster(nodePods{})}, "/no/such"},
		"no DRA plugins dir":     {[]string{"--dra-plugins-dir", "/no/such"}, nil, `--dra-plugins-dir "/no/such": not a directory`},
		"an empty DRA dir":       {[]string{"--dra-plugins-dir", ""}, nil, `--dra-plugins-dir "": not a directory`},
	} {
		var out strings.Builder
		err := app.Run(t.Context(), append([]string{"exporter", "--sysfs-root", ""}, tc.args...), nil, &out, &out, tc.opts...)
		if app.ExitCode(err) != cli.ExitUsage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v (exit %d), want exit 2 and %q", name, err, app.ExitCode(err), tc.want)
		}
	}
}

// nodePods is a cli.Cluster whose kubeconfig is never found.
type nodePods struct{}

func (nodePods) PodHealth(string) (cli.PodHealthGetter, error) {
	return nil, errors.New("no API server")
}
func (nodePods) DRAFront() pluginrun.DRAFront      { return nil }
func (nodePods) DRA(string) (cli.DRAReader, error) { return nil, errors.New("no API server") }
func (nodePods) NodePods(_ context.Context, kubeconfig, _ string) (cli.NodePodsGetter, error) {
	return nil, errors.New("--kubeconfig " + kubeconfig + ": the file does not exist")
}
