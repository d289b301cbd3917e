package get

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"go.uber.org/goleak"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/kubelet"
	"github.com/dpkit/dpkit/pkg/podresources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runKubelet runs an emulated kubelet on a fresh root for the test.
func runKubelet(t *testing.T) string {
	t.Helper()
	root, err := os.MkdirTemp("", "kg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- kubelet.Run(ctx, kubelet.Options{Root: root}, func(*kubelet.Emulator) { close(started) })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubelet: %v", err)
		}
	})
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("kubelet: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("kubelet did not start")
	}
	return root
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
	c := kubelet.NewClient(kubelet.AdminSocket(root))
	defer c.Close()
	if _, err := c.AdmitPod(context.Background(), []byte("metadata: {name: web, namespace: shop}\nspec: {containers: [{name: nginx}]}\n")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		args     []string
		contains []string
		exit     int
	}{
		{[]string{"pods", "--root", root}, []string{"NAMESPACE  NAME  CONTAINER  RESOURCE  DEVICES  NUMA", "shop       web   nginx      -         -        -"}, 0},
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
	var pods []Pod
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
	got := PodsFromList(resp)
	want := []Pod{
		{Namespace: "a", Name: "y", Containers: []Container{{Name: "app", Devices: []Devices{
			{Resource: "example.com/bar", DeviceIDs: []string{"b0"}},
			{Resource: "example.com/foo", DeviceIDs: []string{"dev-1", "dev-3"}, NUMANodes: []int64{0, 1}},
		}}}},
		{Namespace: "b", Name: "z", Containers: []Container{{Name: "c"}}},
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
	writeDevices(tw, []kubelet.Device{
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
	writePods(tw, []Pod{{Namespace: "ml", Name: "p", Containers: []Container{{Name: "c", Devices: []Devices{
		{Resource: "example.com/foo", DeviceIDs: []string{"dev-0", "dev\x1b[2J"}},
	}}}}})
	_ = tw.Flush()
	if want := `ml         p     c          example.com/foo  dev-0,"dev\x1b[2J"  -`; !strings.Contains(b.String(), want) {
		t.Errorf("pods table:\n%s\nlacks %q", b.String(), want)
	}
}
