package devicemanager

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

// registerErr registers the stub and returns the kubelet's answer.
func (p *stubPlugin) registerErr(t testing.TB, kubeletSock string) error {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+kubeletSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(p.socket), ResourceName: p.resource,
	})
	return err
}

// TestSameEndpointRefusedWhileConnected: a second registration of a socket
// the manager is still connected to is refused with the kubelet's error,
// and the first connection keeps serving; once that plugin is gone the same
// path registers again.
func TestSameEndpointRefusedWhileConnected(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a", "b"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "2 devices", func() bool { return allocatable(m, res) == 2 })

	err := p.registerErr(t, m.SocketPath())
	want := "device plugin already connected: " + p.socket
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second registration of a connected socket: %v, want %q", err, want)
	}
	if rs := m.Resources(); len(rs) != 1 || !rs[0].Connected || rs[0].Allocatable != 2 {
		t.Fatalf("after the refused registration: %+v, want the first connection serving 2 devices", rs)
	}
	if _, err := m.Admit(context.Background(), pod("p1", c("app", 1)).build()); err != nil {
		t.Fatalf("Admit through the first connection: %v", err)
	}

	// The plugin goes away: its stream ends and the path is free again.
	p.stop()
	waitFor(t, m, "plugin disconnected", func() bool { rs := m.Resources(); return len(rs) == 1 && !rs[0].Connected })
	if err := os.Remove(p.socket); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	p2 := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a", "b"))
	p2.register(t, m.SocketPath())
	waitFor(t, m, "reconnected", func() bool { rs := m.Resources(); return len(rs) == 1 && rs[0].Connected && rs[0].Capacity == 2 })
}

// TestPreStartWithoutPlugin: while a resource has no connected plugin, as
// in the kubelet, its last options decide: a plugin that never asked for
// PreStart is skipped (the container starts), one that did fails because
// its endpoint is stopped; after a restart, a resource from the checkpoint
// that has not registered again is skipped.
func TestPreStartWithoutPlugin(t *testing.T) {
	for _, tc := range []struct {
		name     string
		required bool
		wantErr  string
	}{
		{"not required", false, ""},
		{"required", true, "device plugin PreStartContainer rpc failed with err: endpoint of " + res + " has been stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testdir.Short(t, "dm")
			m := startManager(t, Config{Root: dir})
			p := newStub(t, PluginDir(dir), res, "dev.sock", &pluginapi.DevicePluginOptions{PreStartRequired: tc.required}, devs("a", "b"))
			p.register(t, m.SocketPath())
			waitFor(t, m, "2 devices", func() bool { return allocatable(m, res) == 2 })
			if _, err := m.Admit(context.Background(), pod("p1", c("app", 1)).build()); err != nil {
				t.Fatal(err)
			}
			if err := m.PreStartContainer(context.Background(), "p1", "app"); err != nil {
				t.Fatalf("PreStartContainer with the plugin connected: %v", err)
			}
			p.stop()
			waitFor(t, m, "plugin disconnected", func() bool { rs := m.Resources(); return len(rs) == 1 && !rs[0].Connected })
			err := m.PreStartContainer(context.Background(), "p1", "app")
			if tc.wantErr == "" && err != nil {
				t.Fatalf("PreStartContainer with the plugin gone: %v, want it skipped", err)
			}
			if tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr) {
				t.Fatalf("PreStartContainer with the plugin gone: %v, want %q", err, tc.wantErr)
			}
			wantCalls := 0
			if tc.required {
				wantCalls = 1
			}
			if got := strings.Count(strings.Join(p.Calls(), " "), "PreStart:"); got != wantCalls {
				t.Errorf("plugin saw %d PreStart calls (%v), want %d", got, p.Calls(), wantCalls)
			}

			// A restart: the resource comes back from the checkpoint
			// with no options; its containers start.
			m.Stop()
			if _, err := checkpoint.Read(m.CheckpointPath()); err != nil {
				t.Fatal(err)
			}
			m2 := startManager(t, Config{Root: dir})
			if err := m2.PreStartContainer(context.Background(), "p1", "app"); err != nil {
				t.Fatalf("PreStartContainer after a restart, before the plugin returns: %v, want it skipped", err)
			}
		})
	}
}

// levels is a slog handler that keeps the records at WARN and above.
type levels struct {
	mu      sync.Mutex
	records []string
}

func (l *levels) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }
func (l *levels) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, r.Level.String()+" "+r.Message)
	return nil
}
func (l *levels) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *levels) WithGroup(string) slog.Handler      { return l }

func (l *levels) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.records, "\n")
}

// TestStreamEndLogged: a plugin that ends its ListAndWatch stream (what
// the SDK does when it stops) is leaving, not failing: nothing is logged
// at WARN or above. A plugin whose connection drops (it died) is an
// error. Either way its devices are unhealthy until it returns.
func TestStreamEndLogged(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(*stubPlugin)
		want string
	}{
		{"plugin ends its stream", (*stubPlugin).endStreams, ""},
		{"plugin dies", (*stubPlugin).stop, "ERROR ListAndWatch ended"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testdir.Short(t, "dm")
			logs := &levels{}
			m := startManager(t, Config{Root: dir, Logger: slog.New(logs)})
			p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a", "b"))
			p.register(t, m.SocketPath())
			waitFor(t, m, "2 devices", func() bool { return allocatable(m, res) == 2 })
			tc.end(p)
			waitFor(t, m, "plugin disconnected", func() bool { rs := m.Resources(); return len(rs) == 1 && !rs[0].Connected && rs[0].Allocatable == 0 })
			if got := logs.String(); got != tc.want {
				t.Errorf("logged at WARN and above:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}
