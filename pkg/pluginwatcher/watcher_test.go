package pluginwatcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/pluginwatcher/pwtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait for the watcher; a healthy run takes
// milliseconds.
const waitTimeout = 20 * time.Second

func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}

func startPlugin(t *testing.T, socket string, info *registerapi.PluginInfo) *pwtest.Plugin {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := pwtest.StartPlugin(socket, info)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// startWatcher starts a watcher on cfg and stops it at the end of the test.
func startWatcher(t *testing.T, cfg Config) *Watcher {
	t.Helper()
	if cfg.ReconcilePeriod == 0 {
		cfg.ReconcilePeriod = 50 * time.Millisecond
	}
	if cfg.InitialBackoff == 0 {
		cfg.InitialBackoff = 20 * time.Millisecond
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := w.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-w.Done()
	})
	return w
}

func devicePluginInfo(name, endpoint string) *registerapi.PluginInfo {
	return &registerapi.PluginInfo{Type: DevicePlugin, Name: name, Endpoint: endpoint, SupportedVersions: []string{"v1beta1"}}
}

func TestRegistration(t *testing.T) {
	t.Parallel()
	errValidate := errors.New("unsupported versions [v0]")
	errRegister := errors.New("cannot reach endpoint")
	tests := []struct {
		name        string
		socket      string // relative to the watched directory
		info        *registerapi.PluginInfo
		validateErr error
		registerErr error
		// wantOps are the handler calls expected, in order.
		wantOps      []string
		wantEndpoint string // "" means the socket path
		wantStatus   *registerapi.RegistrationStatus
		wantFailure  bool
	}{
		{
			name:         "device plugin with endpoint",
			socket:       "gpu.sock",
			info:         devicePluginInfo("example.com/gpu", "/var/lib/kubelet/device-plugins/gpu.sock"),
			wantOps:      []string{"validate", "register"},
			wantEndpoint: "/var/lib/kubelet/device-plugins/gpu.sock",
			wantStatus:   &registerapi.RegistrationStatus{PluginRegistered: true},
		},
		{
			name:       "empty endpoint means the socket itself",
			socket:     "fpga.sock",
			info:       devicePluginInfo("example.com/fpga", ""),
			wantOps:    []string{"validate", "register"},
			wantStatus: &registerapi.RegistrationStatus{PluginRegistered: true},
		},
		{
			name:       "socket in a subdirectory created after start",
			socket:     "vendor/nic.sock",
			info:       devicePluginInfo("example.com/nic", ""),
			wantOps:    []string{"validate", "register"},
			wantStatus: &registerapi.RegistrationStatus{PluginRegistered: true},
		},
		{
			name:        "unknown plugin type",
			socket:      "csi.sock",
			info:        &registerapi.PluginInfo{Type: "CSIPlugin", Name: "csi.example.com"},
			wantStatus:  &registerapi.RegistrationStatus{Error: "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket {socket}"},
			wantFailure: true,
		},
		{
			name:        "validation failure",
			socket:      "bad.sock",
			info:        devicePluginInfo("example.com/bad", ""),
			validateErr: errValidate,
			wantOps:     []string{"validate"},
			wantStatus:  &registerapi.RegistrationStatus{Error: "RegisterPlugin error -- plugin validation failed with err: unsupported versions [v0]"},
			wantFailure: true,
		},
		{
			name:        "registration failure",
			socket:      "down.sock",
			info:        devicePluginInfo("example.com/down", ""),
			registerErr: errRegister,
			wantOps:     []string{"validate", "register"},
			wantStatus:  &registerapi.RegistrationStatus{Error: "RegisterPlugin error -- plugin registration failed with err: cannot reach endpoint"},
			wantFailure: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := testdir.Short(t, "pw")
			h := &pwtest.Handler{
				ValidateErr: func(string, string, []string) error { return tc.validateErr },
				RegisterErr: func(string, string, []string) error { return tc.registerErr },
			}
			// A long back-off keeps failures to one attempt.
			w := startWatcher(t, Config{Dir: dir, Handlers: map[string]Handler{DevicePlugin: h}, InitialBackoff: time.Hour})
			socket := filepath.Join(dir, tc.socket)
			p := startPlugin(t, socket, tc.info)
			ctx := waitCtx(t)

			statuses, err := p.WaitStatuses(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.wantStatus.Error
			want = strings.ReplaceAll(want, "{socket}", socket)
			if got := statuses[0]; got.PluginRegistered != tc.wantStatus.PluginRegistered || got.Error != want {
				t.Errorf("status = {registered: %v, error: %q}, want {registered: %v, error: %q}", got.PluginRegistered, got.Error, tc.wantStatus.PluginRegistered, want)
			}
			if len(tc.wantOps) > 0 {
				if _, err := h.WaitCalls(ctx, len(tc.wantOps)); err != nil {
					t.Fatal(err)
				}
			}
			// The status is sent after the handler calls, so they are all in.
			if got := h.Ops(); !slices.Equal(got, tc.wantOps) {
				t.Errorf("handler calls = %v, want %v", got, tc.wantOps)
			}
			wantEndpoint := tc.wantEndpoint
			if wantEndpoint == "" {
				wantEndpoint = socket
			}
			for _, c := range h.Calls() {
				if c.Name != tc.info.Name || c.Endpoint != wantEndpoint || !slices.Equal(c.Versions, tc.info.SupportedVersions) {
					t.Errorf("%s(%q, %q, %v), want (%q, %q, %v)", c.Op, c.Name, c.Endpoint, c.Versions, tc.info.Name, wantEndpoint, tc.info.SupportedVersions)
				}
			}

			plugins := w.Plugins()
			failures := w.Failures()
			if tc.wantFailure {
				if len(plugins) != 0 {
					t.Errorf("Plugins() = %+v, want none", plugins)
				}
				if len(failures) != 1 || failures[0].SocketPath != socket || failures[0].Failures != 1 || failures[0].LastError == "" {
					t.Errorf("Failures() = %+v, want one failure of %s", failures, socket)
				}
				return
			}
			if len(failures) != 0 {
				t.Errorf("Failures() = %+v, want none", failures)
			}
			if len(plugins) != 1 {
				t.Fatalf("Plugins() = %+v, want one plugin", plugins)
			}
			got := plugins[0]
			if got.SocketPath != socket || got.Type != tc.info.Type || got.Name != tc.info.Name || got.Endpoint != wantEndpoint ||
				!slices.Equal(got.Versions, tc.info.SupportedVersions) || got.Seen.IsZero() || got.Registered.Before(got.Seen) {
				t.Errorf("Plugins()[0] = %+v", got)
			}
		})
	}
}

// BenchmarkReconcileSteadyState measures a reconcile pass over n
// registered plugins with nothing to do, the loop's cost every period.
func BenchmarkReconcileSteadyState(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			w, err := New(Config{Dir: "x"})
			if err != nil {
				b.Fatal(err)
			}
			for i := range n {
				path := fmt.Sprintf("/r/plugins_registry/p%d.sock", i)
				w.desired[path] = desired{gen: uint64(i + 1)}
				w.actual[path] = registered{gen: uint64(i + 1)}
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				w.reconcile(ctx)
			}
		})
	}
}
