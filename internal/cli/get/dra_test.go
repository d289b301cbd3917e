package get

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/internal/unixsock"
	"github.com/dpkit/dpkit/pkg/podresources"
)

// claimsDRA answers for every container of pod ml/train: its claims
// "gpu" (two devices, in both containers) and "nic".
type claimsDRA struct{}

func (claimsDRA) GetDynamicResources(pod *corev1.Pod, c *corev1.Container) []*podresourcesv1.DynamicResource {
	if pod.Name != "train" {
		return nil
	}
	gpu := &podresourcesv1.DynamicResource{ClaimName: "gpu", ClaimNamespace: pod.Namespace, ClaimResources: []*podresourcesv1.ClaimResource{
		{DriverName: "gpu.example.com", PoolName: "node-a", DeviceName: "gpu-10", CdiDevices: []*podresourcesv1.CDIDevice{{Name: "example.com/gpu=gpu-10"}}},
		{DriverName: "gpu.example.com", PoolName: "node-a", DeviceName: "gpu-2", CdiDevices: []*podresourcesv1.CDIDevice{{Name: "example.com/gpu=gpu-2"}}},
	}}
	if c.Name == "main" {
		return []*podresourcesv1.DynamicResource{gpu, {ClaimName: "nic", ClaimNamespace: pod.Namespace, ClaimResources: []*podresourcesv1.ClaimResource{{DriverName: "nic.example.com", PoolName: "node-a", DeviceName: "eth1"}}}}
	}
	return []*podresourcesv1.DynamicResource{gpu}
}

// servePodResources serves a PodResources API on a socket in a fresh
// root: pod ml/train (containers main and side) with the claims of
// claimsDRA, and pod ml/idle without claims. It returns the root.
func servePodResources(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	pods := podresources.NewPodStore(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", UID: "u1"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}, {Name: "side"}}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "idle", UID: "u2"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}},
	)
	srv, err := podresources.NewServer(podresources.Config{Providers: podresources.Providers{Pods: pods, DynamicResources: claimsDRA{}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	l, err := unixsock.Listen(podresources.SocketPath(root))
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- srv.ServeListener(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("PodResources server: %v", err)
		}
	})
	return root
}

// fakeCluster is a cli.Cluster whose API server has the claims and slices
// given.
type fakeCluster struct {
	claims []cli.Claim
	slices []cli.Slice
}

func (fakeCluster) PodHealth(string) (cli.PodHealthGetter, error) { return nil, errors.New("no pods") }
func (fakeCluster) DRAFront() pluginrun.DRAFront                  { return nil }
func (f fakeCluster) DRA(string) (cli.DRAReader, error)           { return f, nil }
func (f fakeCluster) Claims(_ context.Context, namespace string) ([]cli.Claim, error) {
	var out []cli.Claim
	for _, c := range f.claims {
		if namespace == "" || c.Namespace == namespace {
			out = append(out, c)
		}
	}
	return out, nil
}
func (f fakeCluster) Slices(context.Context) ([]cli.Slice, error) { return f.slices, nil }
func (fakeCluster) Allocate(context.Context, string, []byte) error {
	return errors.New("get does not allocate")
}
func (fakeCluster) Release(context.Context, []byte) error { return errors.New("get does not allocate") }
func (fakeCluster) ClaimJSON(context.Context, string, string) ([]byte, error) {
	return nil, errors.New("not here")
}

// runCluster runs "dpkit get" with a cli.Cluster, as dpkit-cluster does.
func runCluster(t *testing.T, c cli.Cluster, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut strings.Builder
	env := &cli.Env{In: strings.NewReader(""), Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler),
		Getenv: func(string) string { return "" }, Cluster: c}
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

// TestClaimsFromPodResources: without --kubeconfig, get claims lists what
// the node's PodResources API says it prepared: one row per claim (a
// claim two containers use once), its pods, its devices sorted as the
// node gave them, and their CDI IDs in the JSON.
func TestClaimsFromPodResources(t *testing.T) {
	root := servePodResources(t)
	out, err := run(t, "claims", "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	want := "NAMESPACE  NAME  STATE     NODE  DEVICES                                                     RESERVED FOR\n" +
		"ml         gpu   prepared  -     gpu.example.com/node-a/gpu-10,gpu.example.com/node-a/gpu-2  train\n" +
		"ml         nic   prepared  -     nic.example.com/node-a/eth1                                 train\n"
	if out != want {
		t.Errorf("get claims:\n%s\nwant\n%s", out, want)
	}
	out, err = run(t, "claim", "ml/gpu", "--root", root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got []cli.Claim
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	wantClaims := []cli.Claim{{Namespace: "ml", Name: "gpu", State: cli.ClaimPrepared, ReservedFor: []string{"train"}, Devices: []cli.ClaimDevice{
		{Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-10", CDIDeviceIDs: []string{"example.com/gpu=gpu-10"}},
		{Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-2", CDIDeviceIDs: []string{"example.com/gpu=gpu-2"}},
	}}}
	if !reflect.DeepEqual(got, wantClaims) {
		t.Errorf("get claim ml/gpu -o json = %+v, want %+v", got, wantClaims)
	}
	if _, err := run(t, "claims", "nope", "--root", root); err == nil || !strings.Contains(err.Error(), `claim "nope" not found`) {
		t.Errorf("get claims nope: %v, want claim \"nope\" not found", err)
	}
	if out, err := run(t, "claims", "-n", "other", "--root", root, "-o", "json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("get claims -n other -o json = %q, %v; want []", out, err)
	}
}

// TestClaimsAndSlicesFromAPIServer: with --kubeconfig the rows come from
// the API server; a claim the node named by --root prepared is "prepared"
// and gets its CDI IDs; slices are sorted by node and listed with their
// devices.
func TestClaimsAndSlicesFromAPIServer(t *testing.T) {
	root := servePodResources(t)
	c := fakeCluster{
		claims: []cli.Claim{
			{Namespace: "ml", Name: "gpu", State: cli.ClaimReserved, Node: "node-a", ReservedFor: []string{"train"}, Devices: []cli.ClaimDevice{
				{Request: "r", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-10"}, {Request: "r", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-2"}}},
			{Namespace: "ml", Name: "later", State: cli.ClaimPending},
			{Namespace: "web", Name: "x", State: cli.ClaimAllocated, Node: "node-b", Devices: []cli.ClaimDevice{{Driver: "gpu.example.com", Pool: "node-b", Device: "gpu-0"}}},
		},
		slices: []cli.Slice{
			{Name: "s-b", Node: "node-b", Driver: "gpu.example.com", Pool: "node-b", Generation: 3, Devices: []string{"gpu-0"}},
			{Name: "s-a", Node: "node-a", Driver: "gpu.example.com", Pool: "node-a", Generation: 1, Devices: []string{"gpu-2", "gpu-10"}},
		},
	}
	out, _, err := runCluster(t, c, "claims", "--kubeconfig", "k", "-n", "ml")
	if err != nil {
		t.Fatal(err)
	}
	want := "NAMESPACE  NAME   STATE    NODE    DEVICES                                                     RESERVED FOR\n" +
		"ml         gpu    reserved node-a  gpu.example.com/node-a/gpu-10,gpu.example.com/node-a/gpu-2  train\n" +
		"ml         later  pending  -       -                                                           -\n"
	if normalize(out) != normalize(want) {
		t.Errorf("get claims --kubeconfig -n ml:\n%s\nwant\n%s", out, want)
	}
	// With the node named, what it prepared is marked.
	out, _, err = runCluster(t, c, "claims", "ml/gpu", "--kubeconfig", "k", "--root", root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got []cli.Claim
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].State != cli.ClaimPrepared || got[0].Devices[1].Request != "r" ||
		!reflect.DeepEqual(got[0].Devices[1].CDIDeviceIDs, []string{"example.com/gpu=gpu-2"}) {
		t.Errorf("get claims ml/gpu --kubeconfig --root = %+v, want prepared with the node's CDI IDs", got)
	}
	out, _, err = runCluster(t, c, "slices", "--kubeconfig", "k")
	if err != nil {
		t.Fatal(err)
	}
	want = "NAME  NODE    DRIVER           POOL    GENERATION  COUNT  DEVICES\n" +
		"s-a   node-a  gpu.example.com  node-a  1           2      gpu-2,gpu-10\n" +
		"s-b   node-b  gpu.example.com  node-b  3           1      gpu-0\n"
	if out != want {
		t.Errorf("get slices --kubeconfig:\n%s\nwant\n%s", out, want)
	}
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"slices"}, "ResourceSlices live in the API server; give --kubeconfig", 2},
		{[]string{"slices", "-n", "ml", "--kubeconfig", "k"}, "--namespace: slices have no namespace", 2},
		{[]string{"slices", "s-c", "--kubeconfig", "k"}, `ResourceSlice "s-c" not found`, 1},
	} {
		_, _, err := runCluster(t, c, tc.args...)
		if cli.ExitCode(err) != tc.code || err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("get %v: %v (exit %d), want exit %d and %q", tc.args, err, cli.ExitCode(err), tc.code, tc.want)
		}
	}
}

// normalize collapses runs of spaces, for tables whose widths do not
// matter to a test.
func normalize(s string) string { return strings.Join(strings.Fields(s), " ") }

// TestClaimsShowShares: a claim holding a share of a shared device shows
// the share and what it takes.
func TestClaimsShowShares(t *testing.T) {
	c := fakeCluster{claims: []cli.Claim{{Namespace: "ml", Name: "s", State: cli.ClaimAllocated, Node: "node-a", Devices: []cli.ClaimDevice{{
		Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0", ShareID: "0b5c", Consumed: map[string]string{"gpu.example.com/memory": "20Gi"},
	}}}}}
	out, _, err := runCluster(t, c, "claims", "--kubeconfig", "k")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "gpu.example.com/node-a/gpu-0[share 0b5c memory=20Gi]") {
		t.Errorf("get claims:\n%s\nwant the share and its memory", out)
	}
}
