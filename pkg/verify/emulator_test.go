package verify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// stubPlugin is a device plugin that lists one device on every
// ListAndWatch stream and keeps the stream open.
type stubPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (stubPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (stubPlugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// listen creates a unix socket at path, replacing what is there, and
// serves srv on it. Closing the listener leaves accepted connections open.
func listen(t *testing.T, srv *grpc.Server, path string) net.Listener {
	t.Helper()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	go func() { _ = srv.Serve(ln) }()
	return ln
}

func newStubServer(t *testing.T) *grpc.Server {
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, stubPlugin{})
	t.Cleanup(srv.Stop)
	return srv
}

// TestEmulatorRefusesConnectedEndpoint checks that the emulated kubelet,
// like the v1.37 device manager, refuses a registration for a resource and
// socket path it is still connected to, with the kubelet's text, tells a
// repeated registration from one on a re-created socket, and accepts the
// path again once the old connection has closed.
func TestEmulatorRefusesConnectedEndpoint(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	e := newEmulator(dir, time.Second, slog.New(slog.DiscardHandler))
	if _, err := e.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.stop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cc, err := grpc.NewClient("unix://"+e.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	const resource = "example.com/x"
	sock := filepath.Join(dir, "p.sock")
	register := func() error {
		_, err := pluginapi.NewRegistrationClient(cc).Register(ctx, &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: filepath.Base(sock), ResourceName: resource,
		})
		return err
	}
	last := func() registration {
		regs := e.registrations()
		return regs[len(regs)-1]
	}
	wantRefused := func(err error, recreated bool) {
		t.Helper()
		if got, want := status.Convert(err).Message(), fmt.Sprintf("device plugin already connected: %s", sock); got != want {
			t.Fatalf("Register answered %v, want the kubelet's %q", err, want)
		}
		if r := last(); !r.AlreadyConnected || r.Recreated != recreated {
			t.Errorf("registration recorded AlreadyConnected=%t Recreated=%t, want true, %t", r.AlreadyConnected, r.Recreated, recreated)
		}
	}

	srv1 := newStubServer(t)
	ln1 := listen(t, srv1, sock)
	if err := register(); err != nil {
		t.Fatalf("first registration: %v", err)
	}
	first := e.current(resource)

	// The same registration again, while connected: refused, a repeat.
	wantRefused(register(), false)
	if !last().counted() {
		t.Error("a repeated registration must count for restart.single-registration")
	}

	// A repeat is judged by the socket as it was when it arrived: the
	// socket deleted while the emulator waits for the old connection to
	// close does not make it a re-created one.
	errc := make(chan error, 1)
	go func() { errc <- register() }()
	if !e.waitFor(ctx, 30*time.Second, func() bool { return !e.settled() }) {
		t.Fatal("the registration did not arrive")
	}
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	wantRefused(<-errc, false)

	// The socket re-created at the same path while the old connection
	// stays open: refused, and the resource stays on the old connection.
	_ = ln1.Close()
	listen(t, srv1, sock)
	wantRefused(register(), true)
	if last().counted() {
		t.Error("a registration on a re-created socket must not count as a repeat")
	}
	if e.current(resource) != first {
		t.Error("a refused registration replaced the connection")
	}

	// Once the old connection is closed, the path registers again.
	srv1.Stop()
	if !e.waitFor(ctx, 30*time.Second, func() bool { return first.ended }) {
		t.Fatal("the emulator did not see the old stream end")
	}
	listen(t, newStubServer(t), sock)
	if err := register(); err != nil {
		t.Fatalf("registration after the old connection closed: %v", err)
	}
	if e.current(resource) == first {
		t.Error("the accepted registration did not replace the connection")
	}
}

// TestSameSocket checks that a socket file is told from one created again
// at the same path even when the new one got the old inode number, as
// happens at once on some file systems: the modification time differs.
func TestSameSocket(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.Stat(path)
	if !sameSocket(a, b) {
		t.Error("the same file is not the same socket")
	}
	later := a.ModTime().Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	c, _ := os.Stat(path)
	if sameSocket(a, c) {
		t.Error("same inode, another modification time: taken as the same socket")
	}
	if sameSocket(a, nil) || sameSocket(nil, a) {
		t.Error("a missing socket is taken as the same")
	}
}
