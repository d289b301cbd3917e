package cri

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/internal/syncbuf"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// serveSocket serves srv on a unix socket in a test directory and
// returns its endpoint.
func serveSocket(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return "unix://" + socket
}

// hangingRuntime answers Version only when the call ends.
type hangingRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (hangingRuntime) Version(ctx context.Context, _ *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestNoCRIRuntime: a socket where no CRI v1 runtime answers, or one that
// does not answer in DialTimeout, is refused with the endpoint named,
// though each later call may take RequestTimeout.
func TestNoCRIRuntime(t *testing.T) {
	t.Parallel()
	hanging := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(hanging, hangingRuntime{})
	for name, endpoint := range map[string]string{
		"no CRI":  serveSocket(t, grpc.NewServer()),
		"hanging": serveSocket(t, hanging),
	} {
		start := time.Now()
		_, err := New(context.Background(), Config{
			Endpoint: endpoint, Node: "n", LogDir: t.TempDir(),
			DialTimeout: 200 * time.Millisecond, RequestTimeout: time.Minute,
		})
		want := "no CRI v1 runtime answers on " + endpoint
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", name, err, want)
		}
		if d := time.Since(start); d > 30*time.Second {
			t.Errorf("%s: New took %s, want DialTimeout", name, d)
		}
	}
}

// TestClientLogsToBackendLogger: the CRI client's own logs (a failed
// pull) go to the backend's logger, not to klog's global one.
func TestClientLogsToBackendLogger(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	var logs syncbuf.Buffer
	b := newTestBackend(t, f, rec, backend.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))}, time.Hour)
	defer b.Close()
	pod := testPod("pull", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "absent:1"})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "ErrImagePull", func(p *corev1.Pod) bool { return waitingReason(p, "ErrImagePull") })
	if want := `level=ERROR msg="PullImage from image service failed"`; !strings.Contains(logs.String(), want) {
		t.Errorf("logs:\n%s\nwant %q", logs.String(), want)
	}
}
