package draverify

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/dpkit/dpkit/pkg/dramanager"
)

// A kubelet v1.34 to v1.36 calls the first of the driver's services it
// speaks, v1 or v1beta1, as v1.37 does.
func TestOlderService(t *testing.T) {
	t.Parallel()
	tests := []struct {
		versions []string
		want     string // "" : refused
	}{
		{[]string{drav1.DRAPluginService}, drav1.DRAPluginService},
		{[]string{drav1beta1.DRAPluginService}, drav1beta1.DRAPluginService},
		{[]string{drav1beta1.DRAPluginService, drav1.DRAPluginService}, drav1beta1.DRAPluginService},
		{[]string{drahealthv1.DRAResourceHealthService, drav1.DRAPluginService}, drav1.DRAPluginService},
		{[]string{"v2.DRAPlugin"}, ""},
		{[]string{drahealthv1.DRAResourceHealthService}, ""},
		{nil, ""},
	}
	for _, tc := range tests {
		got, err := olderService(tc.versions)
		if got != tc.want || (err != nil) != (tc.want == "") {
			t.Errorf("olderService(%q) = %q, %v; want %q", tc.versions, got, err, tc.want)
		}
	}
}

// healthServer reports one device once and then holds the stream.
type healthServer struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
}

func (healthServer) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	err := s.Send(&drahealthv1.NodeWatchResourcesResponse{Devices: []*drahealthv1.DeviceHealth{{
		Device: &drahealthv1.DeviceIdentifier{PoolName: "pool", DeviceName: "dev-0"}, Health: drahealthv1.HealthStatus_HEALTHY,
	}}})
	if err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// What an older kubelet gets from a driver's health: it watches
// v1alpha1 whatever the driver serves, so a driver that serves v1 alone
// answers it Unimplemented, and one that also serves v1alpha1 (the
// helper's V1ServerWrapper) reports.
func TestFirstHealth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		v1alpha1   bool
		newer, old string // want: "reports" or the code
	}{
		{"v1 only", false, "reports", codes.Unimplemented.String()},
		{"v1 and v1alpha1", true, "reports", "reports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sock := filepath.Join(t.TempDir(), "dra.sock")
			lis, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			srv := grpc.NewServer()
			drahealthv1.RegisterDRAResourceHealthServer(srv, healthServer{})
			if tc.v1alpha1 {
				drahealthv1alpha1.RegisterDRAResourceHealthServer(srv, drahealthv1.V1ServerWrapper{Server: healthServer{}})
			}
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = conn.Close() })
			judge := func(a healthAnswer) string {
				if a.reports() {
					return "reports"
				}
				return status.Code(a.err).String()
			}
			newer := firstHealth(t.Context(), dramanager.NewClient(conn, drav1.DRAPluginService, drahealthv1.DRAResourceHealthService), 5*time.Second)
			old := firstHealth(t.Context(), dramanager.NewClient(conn, drav1.DRAPluginService, olderKubelet.health), 5*time.Second)
			if judge(newer) != tc.newer || judge(old) != tc.old {
				t.Errorf("v1.37 got %s (%v), v1.34-v1.36 got %s (%v); want %s and %s", judge(newer), newer, judge(old), old, tc.newer, tc.old)
			}
		})
	}
}

// A stream that sends nothing within the wait is no report.
func TestFirstHealthSilent(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "dra.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	drahealthv1.RegisterDRAResourceHealthServer(srv, silentServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	if a := firstHealth(ctx, dramanager.NewClient(conn, drav1.DRAPluginService, drahealthv1.DRAResourceHealthService), 200*time.Millisecond); a.reports() || a.err == nil {
		t.Errorf("firstHealth = %v, want no report", a)
	}
}

type silentServer struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
}

func (silentServer) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, s grpc.ServerStreamingServer[drahealthv1.NodeWatchResourcesResponse]) error {
	<-s.Context().Done()
	return nil
}
