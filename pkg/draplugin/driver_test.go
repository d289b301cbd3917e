package draplugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/draplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const driverName = dratest.DriverName

// plugin is a device plugin whose snapshots the test sends and whose
// Allocate calls it counts.
type plugin struct {
	snaps chan []deviceplugin.Device
	mu    sync.Mutex
	calls [][]string
}

func newPlugin() *plugin { return &plugin{snaps: make(chan []deviceplugin.Device, 8)} }

func (p *plugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-p.snaps:
			notify(s)
		}
	}
}

func (p *plugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	p.mu.Lock()
	p.calls = append(p.calls, slices.Clone(ids))
	p.mu.Unlock()
	return &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"DEVICES": strings.Join(ids, ",")},
		Mounts:      []*pluginapi.Mount{{HostPath: "/opt/lib", ContainerPath: "/usr/lib/dev", ReadOnly: true}},
		Devices:     []*pluginapi.DeviceSpec{{HostPath: "/dev/" + ids[0], ContainerPath: "/dev/" + ids[0], Permissions: "rw"}},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "vendor.com/dev=" + ids[0]}},
		Annotations: map[string]string{"ignored": "yes"},
	}, nil
}

func (p *plugin) allocations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

func healthy(ids ...string) []deviceplugin.Device {
	out := make([]deviceplugin.Device, len(ids))
	for i, id := range ids {
		out[i] = deviceplugin.Device{ID: id, Healthy: true, NUMANodes: []int64{0}}
	}
	return out
}

// node is a kubelet root with dpkit's DRA manager and plugin watcher on
// it, and a claims directory both sides read.
type node struct {
	// retired starts the drivers in retired mode (Config.Retired).
	retired bool
	// allocated has the drivers hold allocated claims' devices
	// (Config.Allocated).
	allocated *draplugin.AllocatedClaims
	root      string
	claims    dratest.Claims
	client    *fake.Clientset // the API server the driver reads claims from
	m         *dramanager.Manager
}

// add writes an allocated claim where both sides read it.
func (n *node) add(t *testing.T, ns, name string, uid types.UID, reservedFor []types.UID, devices ...string) *resourcev1.ResourceClaim {
	t.Helper()
	c := n.claims.Add(t, ns, name, uid, reservedFor, devices...)
	if _, err := n.client.ResourceV1().ResourceClaims(ns).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// put replaces a claim add wrote.
func (n *node) put(t *testing.T, c *resourcev1.ResourceClaim) {
	t.Helper()
	n.claims.Put(t, c)
	if _, err := n.client.ResourceV1().ResourceClaims(c.Namespace).Update(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func newClient() *fake.Clientset {
	return fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", UID: "node-uid"}})
}

func newNode(t *testing.T) *node {
	t.Helper()
	root := t.TempDir()
	n := &node{root: root, claims: dratest.Claims(filepath.Join(root, "claims")), client: newClient()}
	m, err := dramanager.New(dramanager.Config{Root: root, Claims: n.claims})
	if err != nil {
		t.Fatal(err)
	}
	n.m = m
	ctx, cancel := context.WithCancel(context.Background())
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      filepath.Join(root, "plugins_registry"),
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DRAPlugin: m.PluginHandler()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-w.Done()
		m.Stop()
	})
	return n
}

// waitRegistered waits until the manager has the driver connected.
func (n *node) waitRegistered(t *testing.T) {
	t.Helper()
	for {
		ch := n.m.PluginsChanged()
		for _, p := range n.m.Plugins() {
			if p.Driver == driverName && p.Connected {
				return
			}
		}
		<-ch
	}
}

// driver is a running inventory and DRA driver on the node.
type driver struct {
	p    *plugin
	inv  *inventory.Inventory
	drv  *draplugin.Driver
	stop func()
}

func (n *node) startDriver(t *testing.T, p *plugin, first []deviceplugin.Device) *driver {
	t.Helper()
	return n.startInstance(t, p, first, "")
}

// startInstance starts one instance of the driver; a podUID makes it one
// instance of a rolling update.
func (n *node) startInstance(t *testing.T, p *plugin, first []deviceplugin.Device, podUID types.UID) *driver {
	t.Helper()
	return n.startServing(t, p, p, first, podUID)
}

// startServing starts an instance whose inventory serves served, a
// plugin that wraps p (to add Describe, CounterSets).
func (n *node) startServing(t *testing.T, p *plugin, served deviceplugin.Plugin, first []deviceplugin.Device, podUID types.UID) *driver {
	t.Helper()
	inv := inventory.New("example.com/dev", served, nil)
	drv, err := draplugin.New(draplugin.Config{
		DriverName:  driverName,
		NodeName:    "node-1",
		PoolName:    dratest.Pool,
		PluginsDir:  filepath.Join(n.root, "plugins"),
		RegistryDir: filepath.Join(n.root, "plugins_registry"),
		CDIDir:      filepath.Join(n.root, "cdi"),
		Client:      n.client,
		PodUID:      podUID,
		Retired:     n.retired,
		Allocated:   n.allocated,
	}, inv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := inv.Run(ctx); err != nil {
			t.Errorf("inventory: %v", err)
		}
	})
	wg.Go(func() {
		if err := drv.Run(ctx); err != nil {
			t.Errorf("driver: %v", err)
		}
	})
	ch, stop := inv.Watch()
	p.snaps <- first
	for {
		if _, known := inv.Devices(); known {
			break
		}
		<-ch
	}
	stop()
	d := &driver{p: p, inv: inv, drv: drv}
	var once sync.Once
	d.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(d.stop)
	return d
}

func (n *node) specPath(uid string) string {
	return filepath.Join(n.root, "cdi", draplugin.CDISpecFile(driverName, uid))
}

func dial(t *testing.T, endpoint string) *grpc.ClientConn {
	t.Helper()
	// WaitForReady: a call waits for the socket to be served.
	conn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestPrepareThroughKubeletManager: dpkit's DRA manager finds the driver
// through the plugin watcher, prepares a pod's claim through it, and the
// container gets a CDI device whose spec holds what the plugin's Allocate
// said; unprepare removes the spec and frees the device.
func TestPrepareThroughKubeletManager(t *testing.T) {
	n := newNode(t)
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.waitRegistered(t)
	for {
		ch := d.drv.RegistrationChanged()
		if st := d.drv.RegistrationStatus(); st != nil {
			if !st.PluginRegistered {
				t.Fatalf("registration status %v, want registered", st)
			}
			break
		}
		<-ch
	}
	if err := d.drv.Ready(); err != nil {
		t.Fatalf("registered driver not ready: %v", err)
	}
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-1")
	pod := dratest.Pod("default", "p", "pod-1", "a")
	ctx := context.Background()
	if err := n.m.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cdi, err := n.m.CDIDevices(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{driverName + "/claim=uid-a-req", "vendor.com/dev=dev-1"}; !reflect.DeepEqual(cdi, want) {
		t.Fatalf("CDI devices %v, want %v", cdi, want)
	}
	blob, err := os.ReadFile(n.specPath("uid-a"))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(blob, &spec); err != nil {
		t.Fatal(err)
	}
	want := cdispec.Spec{
		Version: spec.Version, Kind: driverName + "/claim",
		Devices: []cdispec.Device{{Name: "uid-a-req", ContainerEdits: cdispec.ContainerEdits{
			Env:         []string{"DEVICES=dev-1"},
			DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/dev-1", HostPath: "/dev/dev-1", Permissions: "rw"}},
			Mounts:      []*cdispec.Mount{{HostPath: "/opt/lib", ContainerPath: "/usr/lib/dev", Options: []string{"rbind", "ro"}}},
		}}},
	}
	if !reflect.DeepEqual(spec, want) || spec.Version == "" {
		t.Fatalf("CDI spec\n%s\nwant %+v", blob, want)
	}
	if h, _ := d.inv.HeldBy("dev-1"); h != inventory.ClaimHolder("default", "a", "uid-a") {
		t.Fatalf("dev-1 held by %v, want claim a", h)
	}

	if err := n.m.UnprepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.specPath("uid-a")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CDI spec after unprepare: %v, want it gone", err)
	}
	if h, held := d.inv.HeldBy("dev-1"); held {
		t.Fatalf("dev-1 still held by %v after unprepare", h)
	}
}

// TestPrepareIdempotentAndRestart: a second Prepare of a claim answers the
// same without a second Allocate; a new driver on the same directories
// writes a lost CDI spec again and holds the claim's devices again;
// Unprepare of an unknown claim succeeds.
func TestPrepareIdempotentAndRestart(t *testing.T) {
	n := newNode(t)
	p := newPlugin()
	d := n.startDriver(t, p, healthy("dev-0", "dev-1"))
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	ctx := context.Background()
	client := drav1.NewDRAPluginClient(dial(t, d.drv.Endpoint()))
	req := &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Name: "a", Uid: "uid-a"}}}
	first, err := client.NodePrepareResources(ctx, req)
	if err != nil || first.Claims["uid-a"].GetError() != "" {
		t.Fatalf("prepare: %v %v", first, err)
	}
	second, err := client.NodePrepareResources(ctx, req)
	if err != nil || !reflect.DeepEqual(first.Claims["uid-a"].GetDevices(), second.Claims["uid-a"].GetDevices()) {
		t.Fatalf("second prepare %v (%v), want the first's answer %v", second, err, first)
	}
	if got := p.allocations(); got != 1 {
		t.Fatalf("Allocate called %d times, want 1", got)
	}

	d.stop()
	if err := os.Remove(n.specPath("uid-a")); err != nil {
		t.Fatal(err)
	}
	p2 := newPlugin()
	d2 := n.startDriver(t, p2, healthy("dev-0", "dev-1"))
	if _, err := os.Stat(n.specPath("uid-a")); err != nil {
		t.Fatalf("CDI spec after a restart: %v, want it written again", err)
	}
	if h, _ := d2.inv.HeldBy("dev-0"); h != inventory.ClaimHolder("default", "a", "uid-a") {
		t.Fatalf("dev-0 held by %v after a restart, want claim a", h)
	}
	client = drav1.NewDRAPluginClient(dial(t, d2.drv.Endpoint()))
	third, err := client.NodePrepareResources(ctx, req)
	if err != nil || !reflect.DeepEqual(first.Claims["uid-a"].GetDevices(), third.Claims["uid-a"].GetDevices()) || p2.allocations() != 0 {
		t.Fatalf("prepare after restart %v (%v, %d Allocates), want the first answer without Allocate", third, err, p2.allocations())
	}
	unreq := &drav1.NodeUnprepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Name: "a", Uid: "uid-a"}, {Namespace: "default", Name: "x", Uid: "uid-x"}}}
	for range 2 {
		resp, err := client.NodeUnprepareResources(ctx, unreq)
		if err != nil || resp.Claims["uid-a"].GetError() != "" || resp.Claims["uid-x"].GetError() != "" {
			t.Fatalf("unprepare: %v %v", resp, err)
		}
	}
}

// TestRetired: a driver whose resource left DRA keeps what its checkpoint
// lists: the claim's device stays held (from the device plugin front), the
// claim prepares again as before, its unprepare frees the device; a new
// claim is refused, naming the change, and the pool is published empty.
func TestRetired(t *testing.T) {
	n := newNode(t)
	written := recordSlices(t, n.client)
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	ctx := context.Background()
	req := &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Name: "a", Uid: "uid-a"}}}
	first, err := drav1.NewDRAPluginClient(dial(t, d.drv.Endpoint())).NodePrepareResources(ctx, req)
	if err != nil || first.Claims["uid-a"].GetError() != "" {
		t.Fatalf("prepare: %v %v", first, err)
	}
	d.stop()

	n.retired = true
	p := newPlugin()
	d = n.startDriver(t, p, healthy("dev-0", "dev-1"))
	if got := d.drv.PreparedClaims(); got != 1 {
		t.Fatalf("PreparedClaims = %d, want 1", got)
	}
	if h, _ := d.inv.HeldBy("dev-0"); h != inventory.ClaimHolder("default", "a", "uid-a") {
		t.Fatalf("dev-0 held by %v, want claim a", h)
	}
	for s := range written {
		if s.Spec.Driver == driverName && len(s.Spec.Devices) == 0 {
			break
		}
		t.Logf("slice with %d devices, waiting for the empty pool", len(s.Spec.Devices))
	}
	client := drav1.NewDRAPluginClient(dial(t, d.drv.Endpoint()))
	again, err := client.NodePrepareResources(ctx, req)
	if err != nil || !reflect.DeepEqual(first.Claims["uid-a"].GetDevices(), again.Claims["uid-a"].GetDevices()) {
		t.Fatalf("prepare of the checkpointed claim %v (%v), want the first answer %v", again, err, first)
	}
	n.add(t, "default", "b", "uid-b", []types.UID{"pod-2"}, "dev-1")
	resp, err := client.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Name: "b", Uid: "uid-b"}}})
	if err != nil || !strings.Contains(resp.Claims["uid-b"].GetError(), "no longer serves example.com/dev through DRA") || p.allocations() != 0 {
		t.Fatalf("prepare of a new claim: %v %v (%d Allocates), want refused naming the change", resp, err, p.allocations())
	}
	un, err := client.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: req.Claims})
	if err != nil || un.Claims["uid-a"].GetError() != "" {
		t.Fatalf("unprepare: %v %v", un, err)
	}
	if h, held := d.inv.HeldBy("dev-0"); held {
		t.Fatalf("dev-0 held by %v after the unprepare", h)
	}
}

// TestArbiterRefusals: a claimed device is refused to the device plugin
// front, and a device the device plugin front gave out is refused to a
// claim, each naming the holder.
func TestArbiterRefusals(t *testing.T) {
	n := newNode(t)
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.waitRegistered(t)
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	n.add(t, "default", "b", "uid-b", []types.UID{"pod-2"}, "dev-1")
	ctx := context.Background()
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "p1", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	front := d.inv.DevicePluginFront()
	_, err := front.Allocate(ctx, []string{"dev-0"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ResourceClaim default/a (uid-a)") {
		t.Fatalf("Allocate of a claimed device: %v, want FailedPrecondition naming claim a", err)
	}
	if _, err := front.Allocate(ctx, []string{"dev-1"}); err != nil {
		t.Fatal(err)
	}
	err = n.m.PrepareResources(ctx, dratest.Pod("default", "p2", "pod-2", "b"))
	if err == nil || !strings.Contains(err.Error(), `"dev-1" is held by device plugin container`) {
		t.Fatalf("Prepare of a device plugin device: %v, want refused naming the device plugin container", err)
	}
	if _, err := os.Stat(n.specPath("uid-b")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused claim left a CDI spec")
	}
}

// TestHealthStream: the kubelet's manager sees a device go Unhealthy when
// the plugin says so.
func TestHealthStream(t *testing.T) {
	n := newNode(t)
	p := newPlugin()
	d := n.startDriver(t, p, healthy("dev-0"))
	n.waitRegistered(t)
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	if err := n.m.PrepareResources(context.Background(), dratest.Pod("default", "p", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	// Straight from the stream: every device, with the timeout.
	stream, err := drahealthv1.NewDRAResourceHealthClient(dial(t, d.drv.Endpoint())).NodeWatchResources(context.Background(), &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(msg.Devices) != 1 || msg.Devices[0].GetDevice().GetDeviceName() != "dev-0" || msg.Devices[0].GetHealth() != drahealthv1.HealthStatus_HEALTHY || msg.Devices[0].GetHealthCheckTimeoutSeconds() != 30 {
		t.Fatalf("first health message %v", msg)
	}
	p.snaps <- []deviceplugin.Device{{ID: "dev-0", Healthy: false}}
	for {
		if h := n.m.DeviceHealth(driverName, dratest.Pool, "dev-0"); h.Health == dramanager.Unhealthy {
			break
		}
		<-n.m.Updates()
	}
	msg, err = stream.Recv()
	if err != nil || msg.Devices[0].GetHealth() != drahealthv1.HealthStatus_UNHEALTHY {
		t.Fatalf("health message after the change: %v %v", msg, err)
	}
}

// TestRollingUpdate: two instances of the driver (a DaemonSet's old and
// new pod, maxSurge 1) serve at once on sockets of their own over the same
// directories and checkpoint. A claim one prepared holds its device in the
// other too as soon as the checkpoint is written, so the other refuses the
// device to a second claim; once the
// other unprepared it (the kubelet may call either), the device is free in
// both.
func TestRollingUpdate(t *testing.T) {
	n := newNode(t)
	old := n.startInstance(t, newPlugin(), healthy("dev-0"), "pod-old")
	surge := n.startInstance(t, newPlugin(), healthy("dev-0"), "pod-new")
	if old.drv.Endpoint() == surge.drv.Endpoint() || old.drv.RegistrationSocket() == surge.drv.RegistrationSocket() {
		t.Fatalf("the instances share sockets: %s %s", old.drv.Endpoint(), old.drv.RegistrationSocket())
	}
	ctx := context.Background()
	oldc := drav1.NewDRAPluginClient(dial(t, old.drv.Endpoint()))
	newc := drav1.NewDRAPluginClient(dial(t, surge.drv.Endpoint()))
	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	n.add(t, "default", "b", "uid-b", []types.UID{"pod-2"}, "dev-0")
	claimA := []*drav1.Claim{{Namespace: "default", Name: "a", Uid: "uid-a"}}
	claimB := []*drav1.Claim{{Namespace: "default", Name: "b", Uid: "uid-b"}}
	if r, err := oldc.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claimA}); err != nil || r.Claims["uid-a"].GetError() != "" {
		t.Fatalf("old instance, prepare a: %v %v", r, err)
	}
	// The new instance holds the device at once (it follows the
	// checkpoint), before any call reaches it: its device plugin front
	// would not give the device out.
	for {
		ch, stop := surge.inv.Watch()
		h, _ := surge.inv.HeldBy("dev-0")
		if h == inventory.ClaimHolder("default", "a", "uid-a") {
			stop()
			break
		}
		<-ch
		stop()
	}
	r, err := newc.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claimB})
	if err != nil || !strings.Contains(r.Claims["uid-b"].GetError(), "ResourceClaim default/a (uid-a)") {
		t.Fatalf("new instance, prepare b of the device a holds: %v %v, want refused naming claim a", r, err)
	}
	if h, _ := surge.inv.HeldBy("dev-0"); h != inventory.ClaimHolder("default", "a", "uid-a") {
		t.Fatalf("new instance: dev-0 held by %v, want claim a (prepared by the old one)", h)
	}
	if u, err := newc.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claimA}); err != nil || u.Claims["uid-a"].GetError() != "" {
		t.Fatalf("new instance, unprepare a: %v %v", u, err)
	}
	if _, err := os.Stat(n.specPath("uid-a")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CDI spec of a after the new instance unprepared it: %v, want gone", err)
	}
	if r, err := oldc.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claimB}); err != nil || r.Claims["uid-b"].GetError() != "" {
		t.Fatalf("old instance, prepare b once a is unprepared: %v %v", r, err)
	}
	if h, _ := old.inv.HeldBy("dev-0"); h != inventory.ClaimHolder("default", "b", "uid-b") {
		t.Fatalf("old instance: dev-0 held by %v, want claim b", h)
	}
}

// describing is a plugin that describes its devices.
type describing struct{ *plugin }

func (describing) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	return deviceplugin.DeviceInfo{
		PCIBusID:   "0000:3b:00.0",
		Attributes: map[string]deviceplugin.Attribute{"model": deviceplugin.StringAttr("X1"), "cores": deviceplugin.IntAttr(8)},
		Capacity:   map[string]string{"memory": "80Gi"},
	}, id == "GPU_0"
}

// recordSlices sends the devices of every ResourceSlice written to client.
func recordSlices(t *testing.T, client *fake.Clientset) <-chan *resourcev1.ResourceSlice {
	ch := make(chan *resourcev1.ResourceSlice, 16)
	record := func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj := a.(interface{ GetObject() runtime.Object }).GetObject()
		s, ok := obj.(*resourcev1.ResourceSlice)
		if !ok {
			t.Errorf("%s of a %T", a.GetVerb(), obj)
			return false, nil, nil
		}
		select {
		case ch <- s.DeepCopy():
		default:
			t.Errorf("ResourceSlice written but not read: %+v", s)
		}
		return false, nil, nil
	}
	client.PrependReactor("create", "resourceslices", record)
	client.PrependReactor("update", "resourceslices", record)
	return ch
}

// runPublishing runs inv and a driver on it for node-1, publishing to
// cfg.Client, until the test ends; the driver's name, pool and
// directories are the tests' own. It returns the context both run
// under.
func runPublishing(t *testing.T, inv *inventory.Inventory, cfg draplugin.Config) context.Context {
	t.Helper()
	root := t.TempDir()
	cfg.DriverName, cfg.NodeName, cfg.PoolName = driverName, "node-1", dratest.Pool
	cfg.PluginsDir, cfg.RegistryDir, cfg.CDIDir = filepath.Join(root, "plugins"), filepath.Join(root, "registry"), filepath.Join(root, "cdi")
	drv, err := draplugin.New(cfg, inv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { _ = inv.Run(ctx) })
	wg.Go(func() { _ = drv.Run(ctx) })
	return ctx
}

// TestPublishedDevices: the devices published carry their ID, NUMA node
// and what the plugin describes; an unhealthy one is tainted; one the
// device plugin front gave out is withdrawn.
func TestPublishedDevices(t *testing.T) {
	root := t.TempDir()
	sys := filepath.Join(root, "sys")
	if err := os.MkdirAll(filepath.Join(sys, "bus", "pci", "devices"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:3a/0000:3b:00.0", filepath.Join(sys, "bus", "pci", "devices", "0000:3b:00.0")); err != nil {
		t.Fatal(err)
	}
	p := newPlugin()
	inv := inventory.New("example.com/dev", describing{p}, nil)
	client := newClient()
	rec := recordSlices(t, client)
	ctx := runPublishing(t, inv, draplugin.Config{SysfsRoot: sys, Client: client})
	p.snaps <- []deviceplugin.Device{{ID: "GPU_0", Healthy: true, NUMANodes: []int64{1}}, {ID: "gpu-1", Healthy: false}}
	slice := <-rec
	devs := slice.Spec.Devices
	if len(devs) != 2 {
		t.Fatalf("published %d devices, want 2", len(devs))
	}
	if slice.Spec.Driver != driverName || slice.Spec.Pool.Name != dratest.Pool || ptrDeref(slice.Spec.NodeName) != "node-1" ||
		len(slice.OwnerReferences) != 1 || slice.OwnerReferences[0].Kind != "Node" || slice.OwnerReferences[0].UID != "node-uid" {
		t.Fatalf("ResourceSlice %+v %+v, want the driver's pool on node-1, owned by the Node", slice.ObjectMeta, slice.Spec)
	}
	name0 := draplugin.DeviceName("GPU_0")
	str := func(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }
	one, eight := int64(1), int64(8)
	want := map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		driverName + "/id":                str("GPU_0"),
		"resource.kubernetes.io/numaNode": {IntValue: &one},
		"resource.kubernetes.io/pciBusID": str("0000:3b:00.0"),
		"resource.kubernetes.io/pcieRoot": str("pci0000:3a"),
		driverName + "/model":             str("X1"),
		driverName + "/cores":             {IntValue: &eight},
	}
	for _, d := range devs {
		switch d.Name {
		case name0:
			if !reflect.DeepEqual(d.Attributes, want) || !d.Capacity[driverName+"/memory"].Value.Equal(resource.MustParse("80Gi")) || len(d.Taints) != 0 {
				t.Fatalf("device %s = %+v, want attributes %v and memory 80Gi", name0, d, want)
			}
		case "gpu-1":
			if len(d.Taints) != 1 || d.Taints[0].Key != draplugin.UnhealthyTaintKey(driverName) || d.Taints[0].Effect != resourcev1.DeviceTaintEffectNoSchedule {
				t.Fatalf("unhealthy device %+v, want a NoSchedule taint", d)
			}
		default:
			t.Fatalf("unexpected device %s", d.Name)
		}
	}
	if _, err := inv.DevicePluginFront().Allocate(ctx, []string{"gpu-1"}); err != nil {
		t.Fatal(err)
	}
	if devs := (<-rec).Spec.Devices; len(devs) != 1 || devs[0].Name != name0 {
		t.Fatalf("published %+v after the device plugin took gpu-1, want only %s", devs, name0)
	}
}

// TestSlicesBackAfterKubeletWipe: the kubelet deletes every ResourceSlice
// of its node as it starts; the driver writes its own back after
// SliceRepairDelay, not after the library's default 30 s sync delay
// (scheduling on the node would stop for as long).
func TestSlicesBackAfterKubeletWipe(t *testing.T) {
	p := newPlugin()
	inv := inventory.New("example.com/dev", p, nil)
	client := newClient()
	rec := recordSlices(t, client)
	ctx := runPublishing(t, inv, draplugin.Config{Client: client})
	p.snaps <- []deviceplugin.Device{{ID: "dev-0", Healthy: true}}
	first := <-rec
	// The slice must be in the controller's informer before it is
	// deleted: wait for it to be stored.
	for {
		if _, err := client.ResourceV1().ResourceSlices().Get(ctx, first.Name, metav1.GetOptions{}); err == nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond): // polling the fake API server
		}
	}
	wiped := time.Now()
	if err := client.ResourceV1().ResourceSlices().Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case again := <-rec:
		if len(again.Spec.Devices) != 1 || again.Spec.Devices[0].Name != "dev-0" {
			t.Fatalf("slice written again with %+v, want dev-0", again.Spec.Devices)
		}
		t.Logf("slice back %v after it was deleted", time.Since(wiped).Round(time.Millisecond))
	case <-time.After(15 * time.Second): // a failure bound: half the library's default delay
		t.Fatal("the deleted ResourceSlice was not written again within 15 s")
	}
}

// TestReadyBeforeRegistration: a driver the kubelet has not registered is
// not ready, and says so.
func TestReadyBeforeRegistration(t *testing.T) {
	root := t.TempDir()
	drv, err := draplugin.New(draplugin.Config{
		DriverName: driverName, NodeName: "node-1",
		PluginsDir: filepath.Join(root, "plugins"), RegistryDir: filepath.Join(root, "registry"), CDIDir: filepath.Join(root, "cdi"),
		Client: newClient(),
	}, inventory.New("example.com/dev", newPlugin(), nil))
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Ready(); err == nil || !strings.Contains(err.Error(), "not registered with the kubelet yet") {
		t.Fatalf("Ready() = %v before any registration, want not registered", err)
	}
}

// TestPrepareSubrequest: a claim allocated through a prioritized list
// (firstAvailable) has results for request "req/big"; the driver reports
// them under request "req", so the container that names "req" gets the
// claim's CDI devices (the kubelet matches request names as given).
func TestPrepareSubrequest(t *testing.T) {
	n := newNode(t)
	n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.waitRegistered(t)
	c := n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-1")
	c.Status.Allocation.Devices.Results[0].Request = "req/big"
	n.put(t, c)
	pod := dratest.Pod("default", "p", "pod-1", "a")
	pod.Spec.Containers[0].Resources.Claims[0].Request = "req"
	ctx := context.Background()
	if err := n.m.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	cdi, err := n.m.CDIDevices(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{driverName + "/claim=uid-a-req", "vendor.com/dev=dev-1"}; !reflect.DeepEqual(cdi, want) {
		t.Fatalf("CDI devices of the container naming request req: %v, want %v", cdi, want)
	}
}

// TestPrepareAdminAccess: an admin-access claim observes a device without
// holding it: it is prepared while another claim holds the device, its
// unprepare leaves that hold, and one prepared first does not keep a
// normal claim or the device plugin front from the device.
func TestPrepareAdminAccess(t *testing.T) {
	n := newNode(t)
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.waitRegistered(t)
	ctx := context.Background()
	admin := func(name, uid string, pod types.UID, dev string) {
		c := n.add(t, "default", name, types.UID(uid), []types.UID{pod}, dev)
		c.Status.Allocation.Devices.Results[0].AdminAccess = ptr(true)
		n.put(t, c)
	}
	holderA := inventory.ClaimHolder("default", "a", "uid-a")

	n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "p1", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	admin("watch", "uid-watch", "pod-2", "dev-0")
	watcher := dratest.Pod("default", "p2", "pod-2", "watch")
	if err := n.m.PrepareResources(ctx, watcher); err != nil {
		t.Fatalf("admin-access claim on a held device: %v, want prepared", err)
	}
	if cdi, err := n.m.CDIDevices(watcher, &watcher.Spec.Containers[0]); err != nil || len(cdi) == 0 {
		t.Fatalf("admin-access container's CDI devices %v (%v), want the device's", cdi, err)
	}
	if err := n.m.UnprepareResources(ctx, watcher); err != nil {
		t.Fatal(err)
	}
	if h, _ := d.inv.HeldBy("dev-0"); h != holderA {
		t.Fatalf("dev-0 held by %v after the admin claim's unprepare, want claim a still", h)
	}

	admin("first", "uid-first", "pod-3", "dev-1")
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "p3", "pod-3", "first")); err != nil {
		t.Fatal(err)
	}
	if h, held := d.inv.HeldBy("dev-1"); held {
		t.Fatalf("dev-1 held by %v: an admin-access claim holds nothing", h)
	}
	if _, err := d.inv.DevicePluginFront().Allocate(ctx, []string{"dev-1"}); err != nil {
		t.Fatalf("device plugin Allocate of a device an admin claim observes: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func ptrDeref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestClaimUIDChecked: a claim UID that is not a UID is refused, by
// Prepare (the helper finds no claim of that UID) and by Unprepare (for
// that claim), and names no file: an Unprepare of "x/../../victim" leaves
// <cdiDir>/../victim.json alone.
func TestClaimUIDChecked(t *testing.T) {
	n := newNode(t)
	d := n.startDriver(t, newPlugin(), healthy("dev-0"))
	victim := filepath.Join(n.root, "victim.json")
	if err := os.WriteFile(victim, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	client := drav1.NewDRAPluginClient(dial(t, d.drv.Endpoint()))
	ctx := context.Background()
	for _, uid := range []string{"x/../../victim", "..", "", "a b"} {
		claims := []*drav1.Claim{{Namespace: "default", Name: "a", Uid: uid}}
		un, err := client.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims})
		if err != nil || !strings.Contains(un.Claims[uid].GetError(), "is not a UID") {
			t.Errorf("Unprepare of UID %q: %v %v, want refused", uid, un, err)
		}
		if pr, err := client.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims}); err == nil && pr.Claims[uid].GetError() == "" {
			t.Errorf("Prepare of UID %q: %v, want refused", uid, pr)
		}
	}
	if _, err := os.Stat(victim); err != nil {
		t.Errorf("%s after an Unprepare of a crafted UID: %v", victim, err)
	}
}

// records is a slog handler that sends every record's message and
// attributes to a channel.
type records chan string

func (r records) Enabled(context.Context, slog.Level) bool { return true }
func (r records) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	select {
	case r <- b.String():
	default:
	}
	return nil
}
func (r records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r records) WithGroup(string) slog.Handler      { return r }

// TestDroppedFields: an API server that drops device taints (the feature
// off in the cluster) stores the unhealthy device without its taint; the
// driver reports it as an error naming the feature, through the helper's
// ResourceSlice controller.
func TestDroppedFields(t *testing.T) {
	p := newPlugin()
	inv := inventory.New("example.com/dev", p, nil)
	client := newClient()
	strip := func(a k8stesting.Action) (bool, runtime.Object, error) {
		if s, ok := a.(interface{ GetObject() runtime.Object }).GetObject().(*resourcev1.ResourceSlice); ok {
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].Taints = nil
			}
		}
		return false, nil, nil
	}
	client.PrependReactor("create", "resourceslices", strip)
	client.PrependReactor("update", "resourceslices", strip)
	logs := make(records, 256)
	runPublishing(t, inv, draplugin.Config{Client: client, Logger: slog.New(logs)})
	p.snaps <- []deviceplugin.Device{{ID: "dev-0", Healthy: false}}
	for {
		select {
		case line := <-logs:
			if strings.Contains(line, "dropped fields") {
				if !strings.Contains(line, "DRADeviceTaints") {
					t.Fatalf("dropped fields reported without the feature: %s", line)
				}
				return
			}
		case <-time.After(time.Minute): // a failure bound, not a synchronisation
			t.Fatal("no error about the dropped taint")
		}
	}
}

// TestHealthReportsPublishedDevices: a device the device plugin front gave
// a container is in no ResourceSlice, and the health stream leaves it out
// too (the kubelet drops a report of a device no claim has), until it is
// free again.
func TestHealthReportsPublishedDevices(t *testing.T) {
	n := newNode(t)
	d := n.startDriver(t, newPlugin(), healthy("dev-0", "dev-1"))
	n.waitRegistered(t)
	ctx := context.Background()
	if _, err := d.inv.DevicePluginFront().Allocate(ctx, []string{"dev-1"}); err != nil {
		t.Fatal(err)
	}
	stream, err := drahealthv1.NewDRAResourceHealthClient(dial(t, d.drv.Endpoint())).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, dev := range msg.Devices {
		names = append(names, dev.GetDevice().GetDeviceName())
	}
	if !slices.Equal(names, []string{"dev-0"}) {
		t.Fatalf("health reported %q with dev-1 held through the device plugin front, want only the published dev-0", names)
	}
}

// TestPrepareWaitsForFirstReport: the helper registers the driver as it
// starts, which can be before the plugin's first device report (a rolling
// update's new instance on a busy node). A Prepare that comes then waits
// for the report within the kubelet's call and succeeds, rather than
// failing the claim against no devices (the kubelet would try the pod
// again only at its next sync, a minute later); a call whose deadline
// passes first says the plugin has not reported.
func TestPrepareWaitsForFirstReport(t *testing.T) {
	n := newNode(t)
	p := newPlugin()
	logs := make(records, 1024)
	inv := inventory.New("example.com/dev", p, nil)
	drv, err := draplugin.New(draplugin.Config{
		DriverName: driverName, NodeName: "node-1", PoolName: dratest.Pool,
		PluginsDir: filepath.Join(n.root, "plugins"), RegistryDir: filepath.Join(n.root, "plugins_registry"), CDIDir: filepath.Join(n.root, "cdi"),
		Client: n.client, Logger: slog.New(logs),
	}, inv)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = inv.Run(ctx) })
	wg.Go(func() { _ = drv.Run(ctx) })
	n.waitRegistered(t) // registered, and the plugin has reported nothing
	claim := n.add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-1")
	client := drav1.NewDRAPluginClient(dial(t, drv.Endpoint()))
	req := &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Name: "a", Uid: "uid-a"}}}

	short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = drv.PrepareResourceClaims(short, []*resourcev1.ResourceClaim{claim})
	cancelShort()
	if err == nil || !strings.Contains(err.Error(), "the plugin has not reported its devices of example.com/dev yet") {
		t.Fatalf("Prepare before any device report, its deadline passed: %v, want an error saying the plugin has not reported", err)
	}

	type answer struct {
		resp *drav1.NodePrepareResourcesResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := client.NodePrepareResources(ctx, req)
		answered <- answer{resp, err}
	}()
	// Both calls say they wait: the second is waiting once it has.
	for waits := 0; waits < 2; {
		select {
		case a := <-answered:
			t.Fatalf("Prepare before any device report answered %v (%v), want it to wait for the report", a.resp, a.err)
		case msg := <-logs:
			if strings.HasPrefix(msg, "Waiting for the plugin's first device report") {
				waits++
			}
		}
	}
	p.snaps <- healthy("dev-0", "dev-1")
	a := <-answered
	if a.err != nil || a.resp.Claims["uid-a"].GetError() != "" {
		t.Fatalf("Prepare after the first report: %v (%v), want the claim prepared", a.resp, a.err)
	}
	if h, _ := inv.HeldBy("dev-1"); h != inventory.ClaimHolder("default", "a", "uid-a") {
		t.Fatalf("dev-1 held by %v, want claim a", h)
	}
}
