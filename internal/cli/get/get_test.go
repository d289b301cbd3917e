package get

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/podresources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runKubelet runs an emulated kubelet on a fresh root for the test.
func runKubelet(t *testing.T) string {
	t.Helper()
	root, _ := runEmulator(t)
	return root
}

// runEmulator is runKubelet that also returns the emulator.
func runEmulator(t *testing.T) (string, *emulator.Emulator) {
	t.Helper()
	root, err := os.MkdirTemp("", "kg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *emulator.Emulator, 1)
	done := make(chan error, 1)
	go func() {
		done <- emulator.Run(ctx, emulator.Options{Root: root}, func(e *emulator.Emulator) { started <- e })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubelet: %v", err)
		}
	})
	select {
	case e := <-started:
		return root, e
	case err := <-done:
		t.Fatalf("kubelet: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("kubelet did not start")
	}
	return "", nil
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &cli.Env{In: strings.NewReader(""), Out: &out, Err: io.Discard, Logger: slog.New(slog.DiscardHandler)}
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestGet(t *testing.T) {
	root := runKubelet(t)
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	if _, err := c.AdmitPod(context.Background(), []byte("metadata: {name: web, namespace: shop}\nspec: {containers: [{name: nginx}]}\n")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		args     []string
		contains []string
		exit     int
	}{
		{[]string{"pods", "--root", root}, []string{"NAMESPACE  NAME  CONTAINER  RESOURCE  DEVICES  HEALTH  NUMA", "shop       web   nginx      -         -        -       -"}, 0},
		{[]string{"po", "--pod-resources-socket", podresources.SocketPath(root), "-o", "yaml"}, []string{"name: web", "namespace: shop"}, 0},
		{[]string{"resources", "--root", root}, []string{"NAME  CAPACITY  ALLOCATABLE  IN USE  CONNECTED"}, 0},
		{[]string{"devices", "--root", root}, []string{"RESOURCE  ID  HEALTHY  NUMA  POD UID"}, 0},
		{[]string{"plugins", "--root", root, "-o", "json"}, []string{`"registered": []`}, 0},
		{[]string{"gadgets", "--root", root}, nil, 2},
		{[]string{"pods", "--root", root, "-o", "xml"}, nil, 2},
		{[]string{"pods", "--root", root + "/nowhere"}, nil, 1},
	}
	for _, tc := range tests {
		out, err := run(t, tc.args...)
		if code := cli.ExitCode(err); code != tc.exit {
			t.Errorf("get %v: exit %d (%v), want %d", tc.args, code, err, tc.exit)
			continue
		}
		for _, s := range tc.contains {
			if !strings.Contains(out, s) {
				t.Errorf("get %v output\n%s\ndoes not contain %q", tc.args, out, s)
			}
		}
	}

	out, err := run(t, "pods", "--root", root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pods []podRow
	if err := json.Unmarshal([]byte(out), &pods); err != nil || len(pods) != 1 || pods[0].Name != "web" || len(pods[0].Containers) != 1 {
		t.Errorf("get pods -o json = %s (%v), want the web pod", out, err)
	}
}

// TestPodsFromList checks the kubelet's one-entry-per-device answer is
// grouped per resource, sorted and de-duplicated (a device on two NUMA
// nodes is listed twice), and pods are sorted.
func TestPodsFromList(t *testing.T) {
	numa := func(ids ...int64) *podresourcesv1.TopologyInfo {
		ti := &podresourcesv1.TopologyInfo{}
		for _, id := range ids {
			ti.Nodes = append(ti.Nodes, &podresourcesv1.NUMANode{ID: id})
		}
		return ti
	}
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Namespace: "b", Name: "z", Containers: []*podresourcesv1.ContainerResources{{Name: "c"}}},
		{Namespace: "a", Name: "y", Containers: []*podresourcesv1.ContainerResources{{Name: "app", Devices: []*podresourcesv1.ContainerDevices{
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-3"}, Topology: numa(1)},
			{ResourceName: "example.com/bar", DeviceIds: []string{"b0"}},
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-1"}, Topology: numa(0)},
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-3"}, Topology: numa(0)},
		}}}},
	}}
	got := podsFromList(resp)
	want := []podRow{
		{Namespace: "a", Name: "y", Containers: []containerRow{{Name: "app", Devices: []deviceGroup{
			{Resource: "example.com/bar", DeviceIDs: []string{"b0"}},
			{Resource: "example.com/foo", DeviceIDs: []string{"dev-1", "dev-3"}, NUMANodes: []int64{0, 1}},
		}}}},
		{Namespace: "b", Name: "z", Containers: []containerRow{{Name: "c"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PodsFromList =\n%+v\nwant\n%+v", got, want)
	}
}

// TestTablesQuoteOddIDs checks that a device ID with a control character
// or a path separator is shown quoted in the tables, so a newline cannot
// start a forged row, and kept as it is in JSON.
func TestTablesQuoteOddIDs(t *testing.T) {
	t.Parallel()
	odd := "dev-1\nexample.com/fake  dev-9  true"
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	writeDevices(tw, []emulator.Device{
		{Resource: "example.com/foo", ID: "dev-0", Healthy: true},
		{Resource: "example.com/foo", ID: odd, Healthy: true},
		{Resource: "example.com/foo", ID: "MIG-GPU-1/0/0", Healthy: false},
	})
	_ = tw.Flush()
	want := `RESOURCE         ID                                      HEALTHY  NUMA  POD UID
example.com/foo  dev-0                                   true     -     -
example.com/foo  "dev-1\nexample.com/fake  dev-9  true"  true     -     -
example.com/foo  "MIG-GPU-1/0/0"                         false    -     -
`
	if b.String() != want {
		t.Errorf("devices table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	writePods(tw, []podRow{{Namespace: "ml", Name: "p", Containers: []containerRow{{Name: "c", Devices: []deviceGroup{
		{Resource: "example.com/foo", DeviceIDs: []string{"dev-0", "dev\x1b[2J"}},
	}}}}})
	_ = tw.Flush()
	if want := `ml         p     c          example.com/foo  dev-0,"dev\x1b[2J"  -`; !strings.Contains(b.String(), want) {
		t.Errorf("pods table:\n%s\nlacks %q", b.String(), want)
	}
}

// TestPodsHealthFromAdmin checks "get pods" on a dpkit kubelet's root
// shows each device's health from its admin API, as the pod's status
// would: Healthy, a device the plugin marks unhealthy, and Unknown once
// the plugin is gone.
func TestPodsHealthFromAdmin(t *testing.T) {
	root, e := runEmulator(t)
	devs := dptest.NewDevices("dev-0", "dev-1", "dev-2")
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: filepath.Join(root, "device-plugins")}, deviceplugin.Resource{Name: "example.com/foo", Plugin: devs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	stopPlugin := func() {
		if cancel != nil {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
			cancel = nil
		}
	}
	defer stopPlugin()
	mgr := e.Manager()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		ch, unsub := mgr.Subscribe()
		defer unsub()
		timeout := time.After(20 * time.Second)
		for !cond() {
			select {
			case <-ch:
			case <-timeout:
				t.Fatalf("timed out waiting for %s: %+v", what, mgr.Resources())
			}
		}
	}
	waitFor("3 devices", func() bool { _, a := mgr.Capacity(); return a["example.com/foo"] == 3 })
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	pod, err := c.AdmitPod(context.Background(), []byte("metadata: {name: train, namespace: ml}\nspec: {containers: [{name: app, resources: {limits: {example.com/foo: 2}}}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ids := pod.Containers[0].Devices[0].DeviceIDs
	row := func(health string) string {
		return "ml         train  app        example.com/foo  " + strings.Join(ids, ",") + "  " + health
	}
	check := func(wantRow string, wantJSON map[string]string) {
		t.Helper()
		out, err := run(t, "pods", "--root", root)
		if err != nil || !strings.Contains(out, wantRow) {
			t.Errorf("get pods (%v):\n%s\nwant a row starting %q", err, out, wantRow)
		}
		out, err = run(t, "pods", "--root", root, "-o", "json")
		var pods []podRow
		if err == nil {
			err = json.Unmarshal([]byte(out), &pods)
		}
		if err != nil || len(pods) != 1 || !reflect.DeepEqual(pods[0].Containers[0].Devices[0].Health, wantJSON) {
			t.Errorf("get pods -o json (%v):\n%s\nwant health %v", err, out, wantJSON)
		}
	}
	check(row("Healthy,Healthy"), map[string]string{ids[0]: "Healthy", ids[1]: "Healthy"})

	devs.SetHealth(ids[1], false)
	waitFor(ids[1]+" unhealthy", func() bool { _, a := mgr.Capacity(); return a["example.com/foo"] == 2 })
	check(row("Healthy,Unhealthy"), map[string]string{ids[0]: "Healthy", ids[1]: "Unhealthy"})

	stopPlugin()
	waitFor("the plugin gone", func() bool { r := mgr.Resources(); return len(r) == 1 && !r[0].Connected })
	check(row("Unknown,Unknown"), map[string]string{ids[0]: "Unknown", ids[1]: "Unknown"})
}

// TestStatusHealth checks health read from pods' status in the API
// server: containers and init containers, by resource and ID, devices the
// status does not name left out, and pods the API server does not have
// left without health.
func TestStatusHealth(t *testing.T) {
	apiPods := map[string]*corev1.Pod{"ns/p": {
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Status: corev1.PodStatus{
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "side", AllocatedResourcesStatus: []corev1.ResourceStatus{
				{Name: "example.com/foo", Resources: []corev1.ResourceHealth{{ResourceID: "s0", Health: corev1.ResourceHealthStatusUnknown}}},
			}}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", AllocatedResourcesStatus: []corev1.ResourceStatus{
				{Name: "example.com/foo", Resources: []corev1.ResourceHealth{{ResourceID: "d0", Health: corev1.ResourceHealthStatusHealthy}, {ResourceID: "d1", Health: corev1.ResourceHealthStatusUnhealthy}}},
			}}},
		},
	}}
	getPod := func(_ context.Context, namespace, name string) (*corev1.Pod, error) {
		return apiPods[namespace+"/"+name], nil // nil: not found
	}
	pods := []podRow{
		{Namespace: "ns", Name: "p", Containers: []containerRow{
			{Name: "side", Devices: []deviceGroup{{Resource: "example.com/foo", DeviceIDs: []string{"s0"}}}},
			{Name: "app", Devices: []deviceGroup{
				{Resource: "example.com/bar", DeviceIDs: []string{"b0"}},
				{Resource: "example.com/foo", DeviceIDs: []string{"d0", "d1", "d2"}},
			}},
		}},
		{Namespace: "ns", Name: "gone", Containers: []containerRow{{Name: "app", Devices: []deviceGroup{{Resource: "example.com/foo", DeviceIDs: []string{"x"}}}}}},
	}
	if err := statusHealth(getPod)(context.Background(), pods); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d          deviceGroup
		want       map[string]string
		wantColumn string
	}{
		{pods[0].Containers[0].Devices[0], map[string]string{"s0": "Unknown"}, "Unknown"},
		{pods[0].Containers[1].Devices[0], nil, "-"},
		{pods[0].Containers[1].Devices[1], map[string]string{"d0": "Healthy", "d1": "Unhealthy"}, "Healthy,Unhealthy,-"},
		{pods[1].Containers[0].Devices[0], nil, "-"},
	} {
		if !reflect.DeepEqual(tc.d.Health, tc.want) || tc.d.healthColumn() != tc.wantColumn {
			t.Errorf("%s %v: health %v (column %q), want %v (%q)", tc.d.Resource, tc.d.DeviceIDs, tc.d.Health, tc.d.healthColumn(), tc.want, tc.wantColumn)
		}
	}
}
