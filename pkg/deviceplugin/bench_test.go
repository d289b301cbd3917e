package deviceplugin_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
)

var allocReq = &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev-1", "dev-2"}}}}

// BenchmarkAllocate is an Allocate round trip through a real gRPC client
// over the plugin's unix socket.
func BenchmarkAllocate(b *testing.B) {
	k := dptest.NewKubelet(b)
	dptest.Serve(b, k, deviceplugin.Resource{Name: res, Plugin: newTestPlugin(64)})
	k.WaitForDevices(b, res, dptest.Count(64))
	c := k.Client(b, res)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Allocate(ctx, allocReq); err != nil {
			b.Fatal(err)
		}
	}
}

// bareServer is the floor: a gRPC device plugin that does nothing but
// answer, with the same response as the test plugin.
type bareServer struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (bareServer) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{Envs: map[string]string{"DEVICES": "dev-1,dev-2"}}}}, nil
}

// BenchmarkAllocateBareGRPC is the same round trip against a bare gRPC
// server doing nothing, over a unix socket.
func BenchmarkAllocateBareGRPC(b *testing.B) {
	dir := testdir.Short(b, "dpb")
	sock := filepath.Join(dir, "bare.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, bareServer{})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	c := pluginapi.NewDevicePluginClient(conn)
	ctx := context.Background()
	if _, err := c.Allocate(ctx, allocReq, grpc.WaitForReady(true)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Allocate(ctx, allocReq); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReRegistration measures the time from the kubelet's restart
// (sockets removed, kubelet.sock created again) to the plugin's next
// registration arriving.
func BenchmarkReRegistration(b *testing.B) {
	k := dptest.NewKubelet(b)
	dptest.Serve(b, k, deviceplugin.Resource{Name: res, Plugin: newTestPlugin(8)})
	k.WaitForRegistrations(b, res, 1)
	n := 1
	b.ResetTimer()
	for b.Loop() {
		k.Restart(b)
		n++
		k.WaitForRegistrations(b, res, n)
	}
}

// BenchmarkHealthChangeToStream measures the time from a plugin reporting
// a health change to the change arriving on an open ListAndWatch stream.
func BenchmarkHealthChangeToStream(b *testing.B) {
	k := dptest.NewKubelet(b)
	p := newTestPlugin(64)
	dptest.Serve(b, k, deviceplugin.Resource{Name: res, Plugin: p})
	k.WaitForDevices(b, res, dptest.Count(64))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := k.Client(b, res).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		b.Fatal(err)
	}
	healthy := true
	var worst time.Duration
	b.ResetTimer()
	for b.Loop() {
		healthy = !healthy
		start := time.Now()
		p.set("dev-7", healthy)
		for {
			m, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			if (m.Devices[7].Health == pluginapi.Healthy) == healthy {
				break
			}
		}
		worst = max(worst, time.Since(start))
	}
	b.ReportMetric(float64(worst.Microseconds()), "max-µs")
}
