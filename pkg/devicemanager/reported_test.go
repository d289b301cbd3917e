package devicemanager

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

// heldPlugin registers and answers GetDevicePluginOptions but sends its
// device list only once released.
type heldPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	release chan struct{}
	server  *grpc.Server
	done    chan struct{}
}

func serveHeld(t *testing.T, socket string) *heldPlugin {
	t.Helper()
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	p := &heldPlugin{release: make(chan struct{}), server: grpc.NewServer(), done: make(chan struct{})}
	pluginapi.RegisterDevicePluginServer(p.server, p)
	go func() { defer close(p.done); _ = p.server.Serve(ln) }()
	t.Cleanup(p.stop)
	return p
}

func (p *heldPlugin) stop() { p.server.Stop(); <-p.done }

func (p *heldPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *heldPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	select {
	case <-p.release:
	case <-s.Context().Done():
		return nil
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs("a", "b")}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// A resource whose plugin registered but has not sent a device list is
// not the device manager's yet, as in the kubelet (whose healthyDevices
// has no entry for it): it is not reported, not checkpointed, and a pod
// asking for it is admitted without devices. A plugin that goes away
// before its first list leaves the resource at zero.
func TestResourceWithoutListIsNotReported(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	register := func(resource, sock string) *heldPlugin {
		t.Helper()
		p := serveHeld(t, filepath.Join(PluginDir(dir), sock))
		(&stubPlugin{resource: resource, socket: filepath.Join(PluginDir(dir), sock)}).register(t, m.SocketPath())
		return p
	}
	held := register(res, "held.sock")
	if c, _ := m.Capacity(); len(c) != 0 {
		t.Fatalf("capacity before the first list = %v, want nothing", c)
	}
	pod := makePod("p1", ctr{name: "main", req: map[string]int64{res: 1}})
	if _, err := m.Admit(context.Background(), pod); err != nil {
		t.Fatalf("Admit before the first list: %v; want admitted without devices", err)
	}
	if pa := m.PodAllocation("p1"); pa != nil {
		t.Fatalf("pod got devices before the first list: %+v", pa)
	}
	if err := m.writeCheckpoint(); err != nil {
		t.Fatal(err)
	}
	cp, err := checkpoint.Read(m.CheckpointPath())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cp.Registered[res]; ok {
		t.Fatalf("checkpoint registers %s before its first list: %v", res, cp.Registered)
	}

	close(held.release)
	waitFor(t, m, "the first list", func() bool { return allocatable(m, res) == 2 })

	const other = "example.com/other"
	gone := register(other, "gone.sock")
	gone.stop()
	waitFor(t, m, "the plugin to go", func() bool {
		c, _ := m.Capacity()
		_, ok := c[other]
		return ok
	})
	if c, a := m.Capacity(); c[other] != 0 || a[other] != 0 {
		t.Fatalf("%s after its plugin left without a list: capacity %d allocatable %d, want 0 and 0", other, c[other], a[other])
	}
	pod2 := makePod("p2", ctr{name: "main", req: map[string]int64{other: 1}})
	if _, err := m.Admit(context.Background(), pod2); err != nil {
		t.Fatalf("Admit of a resource never listed: %v; want admitted without devices", err)
	}
}
