package emulator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/rootlock"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		dratest.RemoveBinary()
		os.Exit(code)
	}))
}

type twoDevices struct{}

func (twoDevices) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	notify([]deviceplugin.Device{{ID: "d0", Healthy: true}, {ID: "d1", Healthy: true}})
	<-ctx.Done()
	return nil
}

func (twoDevices) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEVS": strings.Join(ids, ",")}}, nil
}

// startEmulator runs an emulator on root until the returned stop is called.
func startEmulator(t *testing.T, root string) (*Emulator, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *Emulator, 1)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, Options{Root: root}, func(e *Emulator) { started <- e }) }()
	select {
	case e := <-started:
		return e, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	case err := <-done:
		cancel()
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		cancel()
		t.Fatal("emulator did not start")
	}
	return nil, nil
}

// startPlugin runs an SDK plugin for example.com/foo that registers
// through plugins_registry.
func startPlugin(t *testing.T, root string) func() {
	t.Helper()
	return startPluginWith(t, root, twoDevices{})
}

// startPluginWith is startPlugin serving p.
func startPluginWith(t *testing.T, root string, p deviceplugin.Plugin) func() {
	t.Helper()
	srv, err := deviceplugin.NewServer(deviceplugin.Config{
		PluginDir:    filepath.Join(root, "device-plugins"),
		Registration: deviceplugin.RegistrationRegistry,
		RegistryDir:  filepath.Join(root, "plugins_registry"),
		InstanceID:   "t",
	}, deviceplugin.Resource{Name: "example.com/foo", Plugin: p})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// waitAllocatable waits until example.com/foo has n allocatable devices.
func waitAllocatable(t *testing.T, e *Emulator, n int64) {
	t.Helper()
	ch, unsub := e.Manager().Subscribe()
	defer unsub()
	timeout := time.After(20 * time.Second)
	for {
		for _, r := range e.Manager().Resources() {
			if r.Name == "example.com/foo" && r.Allocatable == n {
				return
			}
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("example.com/foo never had %d allocatable devices: %+v", n, e.Manager().Resources())
		}
	}
}

const podYAML = `apiVersion: v1
kind: Pod
metadata:
  name: trainer
spec:
  containers:
  - name: main
    resources:
      limits:
        example.com/foo: 1
`

func TestEmulator(t *testing.T) {
	root := testdir.Short(t, "kl")
	e, stop := startEmulator(t, root)
	defer func() { stop() }() // stop is replaced by the restart below
	defer startPlugin(t, root)()
	waitAllocatable(t, e, 2)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := NewClient(AdminSocket(root))
	defer c.Close()

	plugins, err := c.Plugins(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(plugins.Registered) != 1 || plugins.Registered[0].Name != "example.com/foo" {
		t.Errorf("Plugins() = %+v, want example.com/foo registered", plugins)
	}

	pod, err := c.AdmitPod(ctx, []byte(podYAML))
	if err != nil {
		t.Fatal(err)
	}
	if pod.Namespace != "default" || pod.UID == "" || len(pod.Containers) != 1 || len(pod.Containers[0].Devices) != 1 ||
		len(pod.Containers[0].Devices[0].DeviceIDs) != 1 {
		t.Fatalf("AdmitPod() = %+v, want default/trainer with one device", pod)
	}
	dev := pod.Containers[0].Devices[0].DeviceIDs[0]
	if h := pod.Containers[0].Devices[0].Health; len(h) != 1 || h[dev] != "Healthy" {
		t.Errorf("AdmitPod() device health %v, want %s Healthy", h, dev)
	}

	errTests := []struct {
		name     string
		manifest string
		code     int
		reason   string
		contains []string
	}{
		{"duplicate", podYAML, http.StatusConflict, "", []string{"already exists"}},
		{"same UID as another pod", "metadata: {name: twin, uid: " + string(pod.UID) + "}\nspec: {containers: [{name: a}]}\n", http.StatusConflict, "",
			[]string{"metadata.uid: pod default/trainer already has UID " + string(pod.UID)}},
		{"UID is a path", "metadata: {name: escape, uid: ../../escaped}\nspec: {containers: [{name: a}]}\n", http.StatusBadRequest, "",
			[]string{`metadata.uid: Invalid value: "../../escaped"`}},
		{"invalid", "metadata: {namespace: Bad_NS}\nspec: {containers: [{name: a}, {name: a}]}\n", http.StatusBadRequest, "",
			[]string{"metadata.name: Required", "metadata.namespace: Invalid", "spec.containers[1].name: Duplicate"}},
		{"unknown field", "metadata: {name: x}\nspec: {containerz: []}\n", http.StatusBadRequest, "", []string{"containerz"}},
		{"too many devices", strings.Replace(strings.Replace(podYAML, "trainer", "greedy", 1), "foo: 1", "foo: 5", 1),
			http.StatusUnprocessableEntity, "UnexpectedAdmissionError", []string{"Allocate failed due to requested number of devices unavailable for example.com/foo"}},
	}
	for _, tc := range errTests {
		_, err := c.AdmitPod(ctx, []byte(tc.manifest))
		var ae *APIError
		ok := errors.As(err, &ae)
		if !ok || ae.StatusCode != tc.code || ae.Reason != tc.reason {
			t.Errorf("%s: AdmitPod() error = %#v, want status %d reason %q", tc.name, err, tc.code, tc.reason)
			continue
		}
		for _, s := range tc.contains {
			if !strings.Contains(ae.Message, s) {
				t.Errorf("%s: error %q does not contain %q", tc.name, ae.Message, s)
			}
		}
	}

	devices, err := c.Devices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inUse := 0
	for _, d := range devices {
		if d.PodUID == pod.UID {
			inUse++
			if d.ID != dev {
				t.Errorf("device %s held by the pod, want %s", d.ID, dev)
			}
		}
	}
	if len(devices) != 2 || inUse != 1 {
		t.Errorf("Devices() = %+v, want 2 devices, 1 held by the pod", devices)
	}

	// The PodResources API reports the same.
	prc, conn, err := prclient.Dial(ctx, podresources.SocketPath(root))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	got, err := prc.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "trainer"})
	if err != nil {
		t.Fatal(err)
	}
	if cs := got.GetPodResources().GetContainers(); len(cs) != 1 || len(cs[0].GetDevices()) != 1 || cs[0].GetDevices()[0].GetDeviceIds()[0] != dev {
		t.Errorf("PodResources Get() = %v, want device %s", got, dev)
	}

	// Admitted pods survive a restart with their devices.
	stop()
	e, stop = startEmulator(t, root)
	pods, err := c.Pods(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != 1 || pods[0].UID != pod.UID || len(pods[0].Containers[0].Devices) != 1 || pods[0].Containers[0].Devices[0].DeviceIDs[0] != dev {
		t.Errorf("Pods() after restart = %+v, want the pod with device %s", pods, dev)
	}

	if _, err := c.DeletePod(ctx, "default", "trainer"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeletePod(ctx, "default", "trainer"); !IsNotFound(err) {
		t.Errorf("second DeletePod() = %v, want not found", err)
	}
	if pods, err := c.Pods(ctx); err != nil || len(pods) != 0 {
		t.Errorf("Pods() after delete = %+v, %v; want none", pods, err)
	}
	if a := e.Manager().PodAllocation(types.UID(pod.UID)); a != nil {
		t.Errorf("the deleted pod still holds %+v", a)
	}
}

// TestOneEmulatorPerRoot checks that a second emulator on a root that one
// serves fails, naming this process, and leaves the first serving.
func TestOneEmulatorPerRoot(t *testing.T) {
	root := testdir.Short(t, "kl")
	_, stop := startEmulator(t, root)
	defer stop()
	err := Run(context.Background(), Options{Root: root}, func(*Emulator) { t.Error("the second emulator started") })
	var held *rootlock.HeldError
	if !errors.As(err, &held) || !strings.Contains(err.Error(), fmt.Sprintf("is in use by pid %d", os.Getpid())) {
		t.Fatalf("second Run = %v, want the root in use by pid %d", err, os.Getpid())
	}
	c := NewClient(AdminSocket(root))
	defer c.Close()
	if _, err := c.AdmitPod(context.Background(), []byte(podYAML)); err != nil {
		t.Errorf("the first emulator no longer admits: %v", err)
	}
}

// fakeSysfs returns a sysfs root whose devices/system/node lists dirs.
func fakeSysfs(t *testing.T, dirs ...string) string {
	t.Helper()
	root := t.TempDir()
	nodes := filepath.Join(root, numa.NodesDir)
	if err := os.MkdirAll(nodes, 0o750); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(nodes, d), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"possible", "online", "node7"} {
		if err := os.WriteFile(filepath.Join(nodes, f), []byte("0-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestRunReadsNUMANodes checks that the NUMA nodes come from sysfs when
// they are not given, that given ones win, and that a policy that needs
// them fails clearly when sysfs lists none.
func TestRunReadsNUMANodes(t *testing.T) {
	sysfs := fakeSysfs(t, "node0", "node1")
	for _, tc := range []struct {
		name  string
		given []int
		want  []int
	}{{"from sysfs", nil, []int{0, 1}}, {"given", []int{3}, []int{3}}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			got := make(chan []int, 1)
			err := Run(ctx, Options{Root: testdir.Short(t, "kl"), TopologyPolicy: "single-numa-node", NUMANodes: tc.given, SysfsRoot: sysfs}, func(e *Emulator) {
				got <- e.NUMANodes()
				cancel()
			})
			if err != nil {
				t.Fatal(err)
			}
			if g := <-got; !slices.Equal(g, tc.want) {
				t.Errorf("NUMANodes() = %v, want %v", g, tc.want)
			}
		})
	}
	err := Run(context.Background(), Options{Root: testdir.Short(t, "kl"), TopologyPolicy: "restricted", SysfsRoot: t.TempDir()}, func(*Emulator) { t.Error("started") })
	if err == nil || !strings.Contains(err.Error(), "topology policy restricted needs the machine's NUMA nodes") || !strings.Contains(err.Error(), "--numa-nodes") {
		t.Errorf("Run without NUMA nodes = %v, want an error pointing to --numa-nodes", err)
	}
}

func TestRootExplain(t *testing.T) {
	t.Parallel()
	base := errors.New("dial: no such file")
	for _, tc := range []struct {
		name string
		root Root
		err  error
		want string
	}{
		{"flag", Root{Dir: "/r", From: FromFlag}, base, "dial: no such file"},
		{"environment", Root{Dir: "/r", From: FromEnv}, base, "dial: no such file\n(root /r, from $DPKIT_ROOT; --root chooses another)"},
		{"invalid manifest", Root{Dir: "/r", From: FromRecorded}, fmt.Errorf("x: %w", &InvalidPodError{}), "x: invalid pod, 0 problem(s):"},
		{"rejected as invalid", Root{Dir: "/r", From: FromDefault}, &APIError{StatusCode: http.StatusBadRequest, Message: "bad"}, "bad"},
		{"nil", Root{Dir: "/r", From: FromEnv}, nil, ""},
	} {
		got := tc.root.Explain(tc.err)
		if (got == nil) != (tc.err == nil) || got != nil && got.Error() != tc.want {
			t.Errorf("%s: Explain = %v, want %q", tc.name, got, tc.want)
		}
		if tc.err != nil && !errors.Is(got, tc.err) {
			t.Errorf("%s: Explain lost the error it wraps", tc.name)
		}
	}
}
