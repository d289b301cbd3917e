package virtualnode

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// TestDefaultNodeIP checks the default node IP is an address the node API
// can listen on: one of this machine's, or 127.0.0.1.
func TestDefaultNodeIP(t *testing.T) {
	ip := net.ParseIP(DefaultNodeIP())
	if ip == nil {
		t.Fatalf("DefaultNodeIP() = %q, not an IP address", DefaultNodeIP())
	}
	l, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
	if err != nil {
		t.Fatalf("cannot listen on the default node IP %s: %v", ip, err)
	}
	l.Close()
}

// TestRemovedResourceStaysAtZero checks what the Node says of a
// device-plugin resource through its plugin's life, the kubelet's way: its
// devices while served; capacity kept and allocatable 0 while the plugin
// is away for the grace period; then capacity and allocatable 0 rather
// than no entry; its devices again when a plugin registers again. After a
// restart, the resources an earlier run applied (virtual-kubelet's
// last-applied status) and that are not declared stay at 0; resources set
// on the Node by others are left alone.
func TestRemovedResourceStaysAtZero(t *testing.T) {
	root := testdir.Short(t, "vnp")
	fc := clocktesting.NewFakeClock(time.Unix(1000, 0))
	mgr, err := devicemanager.New(devicemanager.Config{Root: root, Clock: fc, GracePeriod: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer mgr.Stop()
	const foo = "example.com/foo"
	cpu := resource.MustParse("4")
	n := &Node{cfg: Config{Name: "vn", Resources: corev1.ResourceList{corev1.ResourceCPU: cpu}}, mgr: mgr, pluginResources: map[corev1.ResourceName]bool{}}
	check := func(what string, wantCap, wantAlloc map[corev1.ResourceName]int64) {
		t.Helper()
		c, a := n.resources()
		for _, l := range []struct {
			name string
			got  corev1.ResourceList
			want map[corev1.ResourceName]int64
		}{{"capacity", c, wantCap}, {"allocatable", a, wantAlloc}} {
			got := map[corev1.ResourceName]int64{}
			for k, v := range l.got {
				got[k] = v.Value()
			}
			if !maps.Equal(got, l.want) {
				t.Errorf("%s: %s %v, want %v", what, l.name, got, l.want)
			}
		}
	}

	stop := servePlugins(t, root, deviceplugin.Resource{Name: foo, Plugin: dptest.NewDevices("d0", "d1")})
	waitManager(t, mgr, "2 devices", allocatableIs(mgr, map[string]int64{foo: 2}))
	check("served", map[corev1.ResourceName]int64{"cpu": 4, foo: 2}, map[corev1.ResourceName]int64{"cpu": 4, foo: 2})
	stop()
	waitManager(t, mgr, "plugin gone", func() bool { r := mgr.Resources(); return len(r) == 1 && !r[0].Connected })
	check("plugin gone, in the grace period", map[corev1.ResourceName]int64{"cpu": 4, foo: 2}, map[corev1.ResourceName]int64{"cpu": 4, foo: 0})
	fc.Step(2 * time.Minute)
	waitManager(t, mgr, "resource removed", func() bool { return len(mgr.Resources()) == 0 })
	check("removed", map[corev1.ResourceName]int64{"cpu": 4, foo: 0}, map[corev1.ResourceName]int64{"cpu": 4, foo: 0})
	servePlugins(t, root, deviceplugin.Resource{Name: foo, Plugin: dptest.NewDevices("d0", "d1", "d2")})
	waitManager(t, mgr, "3 devices", allocatableIs(mgr, map[string]int64{foo: 3}))
	check("registered again", map[corev1.ResourceName]int64{"cpu": 4, foo: 3}, map[corev1.ResourceName]int64{"cpu": 4, foo: 3})

	// A restart: the earlier run applied example.com/gone and the declared
	// example.com/declared; someone else added example.com/other.
	applied, err := json.Marshal(corev1.NodeStatus{Capacity: corev1.ResourceList{
		"cpu": cpu, "example.com/gone": resource.MustParse("0"), "example.com/declared": resource.MustParse("3"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(&corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "vn2", Annotations: map[string]string{lastAppliedStatus: string(applied)}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{
			"cpu": cpu, "example.com/gone": resource.MustParse("0"), "example.com/declared": resource.MustParse("3"), "example.com/other": resource.MustParse("5"),
		}},
	})
	declared := corev1.ResourceList{corev1.ResourceCPU: cpu, "example.com/declared": resource.MustParse("2")}
	n = &Node{cfg: Config{Name: "vn2", Client: client, Resources: declared}, mgr: mgr, log: slog.New(slog.DiscardHandler), pluginResources: map[corev1.ResourceName]bool{},
		nodes: newNodeCache(client.CoreV1().Nodes(), "vn2"), statusKick: make(chan struct{}, 1)}
	// The node registers: its Create finds the earlier run's Node and
	// takes it.
	n.nodes.existing = n.takeNode
	if _, err := n.nodes.Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn2"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("registering over the earlier run's Node: %v", err)
	}
	if !n.stale || !n.statusPending() {
		t.Error("the earlier run's Node taken, but no status write asked for")
	}
	check("after a restart", map[corev1.ResourceName]int64{"cpu": 4, foo: 3, "example.com/gone": 0, "example.com/declared": 2},
		map[corev1.ResourceName]int64{"cpu": 4, foo: 3, "example.com/gone": 0, "example.com/declared": 2})
}

// TestHostnameAddress checks the node reports the machine's name as its
// Hostname address, as a kubelet does, not the node name (which need not
// resolve), and a configured one when given.
func TestHostnameAddress(t *testing.T) {
	t.Parallel()
	want, err := os.Hostname()
	if err != nil {
		t.Skipf("no hostname: %v", err)
	}
	addr := func(cfg Config) string {
		for _, a := range addresses(cfg) {
			if a.Type == corev1.NodeHostName {
				return a.Address
			}
		}
		return ""
	}
	cfg := Config{Name: "vn-not-a-host", NodeIP: "10.0.0.1"}
	if got := addr(cfg); got != strings.ToLower(want) {
		t.Errorf("Hostname address %q, want the machine's %q", got, strings.ToLower(want))
	}
	cfg.Hostname = "other.example"
	if got := addr(cfg); got != "other.example" {
		t.Errorf("Hostname address %q, want the configured other.example", got)
	}
}

// TestNotifyNodeStopping: virtual-kubelet's node status callback blocks for
// ever once its controller has stopped; handing it a status must not keep
// a stopping node from returning.
func TestNotifyNodeStopping(t *testing.T) {
	t.Parallel()
	ch := make(chan *corev1.Node, 1) // the controller's channel, nobody reading
	cb := func(n *corev1.Node) { ch <- n }
	notifyNode(context.Background(), cb, &corev1.Node{}) // fills it
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		notifyNode(ctx, cb, &corev1.Node{})
		close(done)
	}()
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("notifyNode still waits on a send nobody reads after its context ended")
	}
}

// statusNode is a node with a running device manager on a root of its
// own and no API server: enough to compute and send its status.
func statusNode(t *testing.T) (string, *devicemanager.Manager, *Node) {
	t.Helper()
	root := testdir.Short(t, "vnp")
	mgr, err := devicemanager.New(devicemanager.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := mgr.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(mgr.Stop)
	n := &Node{cfg: Config{Name: "vn", Client: fake.NewClientset()}, mgr: mgr, log: slog.New(slog.DiscardHandler), statusKick: make(chan struct{}, 1), pluginResources: map[corev1.ResourceName]bool{}}
	return root, mgr, n
}

// TestStatusChangeBeforeCallback: devices that register before
// virtual-kubelet gives its status callback (a plugin in the same process
// is quick) reach it once it does, and every later change too.
func TestStatusChangeBeforeCallback(t *testing.T) {
	root, mgr, n := statusNode(t)
	const foo = "example.com/foo"
	devices, unsubscribe := mgr.Subscribe()
	defer unsubscribe()
	n.node = n.nodeObject()
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); n.status.Stop() }()
	n.status.Start(ctx, n.sendStatus, n.statusPending)

	// The change is seen before the callback exists (no watcher yet: the
	// status can only come from NotifyNodeStatus asking for it).
	servePlugins(t, root, deviceplugin.Resource{Name: foo, Plugin: dptest.NewDevices("d0", "d1")})
	waitManager(t, mgr, "2 devices", allocatableIs(mgr, map[string]int64{foo: 2}))

	got := make(chan *corev1.Node, 16)
	n.NotifyNodeStatus(ctx, func(node *corev1.Node) { got <- node })
	want := func(count int64) {
		t.Helper()
		deadline := time.After(time.Minute)
		for {
			select {
			case node := <-got:
				if q := node.Status.Allocatable[foo]; q.Value() == count {
					return
				}
			case <-deadline:
				t.Fatalf("no status with %d %s reached the callback", count, foo)
			}
		}
	}
	want(2)
	go func() {
		for range devices {
			n.devicesChanged(ctx)
		}
	}()
	servePlugins(t, root, deviceplugin.Resource{Name: foo, Plugin: dptest.NewDevices("d0", "d1", "d2")})
	want(3)
}

// TestUnchangedStatusNotSent: the node hands virtual-kubelet its status
// only when its capacity or allocatable changed since the Node was
// registered or last written; a kick with nothing new writes nothing.
func TestUnchangedStatusNotSent(t *testing.T) {
	root, mgr, n := statusNode(t)
	const foo = "example.com/foo"
	n.node = n.nodeObject()
	n.markSent(n.node)
	var sent []*corev1.Node
	n.notifyCB = func(node *corev1.Node) { sent = append(sent, node) }
	ctx := context.Background()
	if n.sendChanged(ctx) || len(sent) != 0 {
		t.Fatalf("the status as registered was sent again (%d sends)", len(sent))
	}
	servePlugins(t, root, deviceplugin.Resource{Name: foo, Plugin: dptest.NewDevices("d0", "d1")})
	waitManager(t, mgr, "2 devices", allocatableIs(mgr, map[string]int64{foo: 2}))
	if !n.sendChanged(ctx) || len(sent) != 1 {
		t.Fatalf("a change of devices was not sent (%d sends)", len(sent))
	}
	if q := sent[0].Status.Allocatable[foo]; q.Value() != 2 {
		t.Fatalf("sent allocatable %s: %v, want 2", foo, sent[0].Status.Allocatable)
	}
	if n.sendChanged(ctx) || len(sent) != 1 {
		t.Fatalf("the status sent was sent again (%d sends)", len(sent))
	}
}

// TestRunPortInUse runs a node on a port another process serves: Run
// fails at once, before the node registers or its backend starts, naming
// the address and why, and the error still says EADDRINUSE to errors.Is.
func TestRunPortInUse(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	client := fake.NewClientset()
	backendStarted := false
	err = Run(context.Background(), Config{
		Name: "vn-port", Root: testdir.Short(t, "vnp"), Client: client, NodeIP: "127.0.0.1", Port: port,
		NewBackend: func(string, string, backend.Config) (backend.Backend, error) {
			backendStarted = true
			return nil, errors.New("the backend must not start")
		},
	}, nil)
	want := "node API: listen tcp " + busy.Addr().String() + ": bind: address already in use: another process serves that port (a kubelet, another dpkit node)"
	if err == nil || err.Error() != want {
		t.Fatalf("Run on a busy port: %v, want %q", err, want)
	}
	if !errors.Is(err, syscall.EADDRINUSE) || !errors.Is(err, ErrPortInUse) {
		t.Errorf("errors.Is(%v, EADDRINUSE / ErrPortInUse) is false", err)
	}
	if backendStarted {
		t.Error("the backend started before the port was taken")
	}
	if nodes, _ := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{}); len(nodes.Items) != 0 {
		t.Errorf("a node whose port is busy registered: %v", nodes.Items)
	}
}
