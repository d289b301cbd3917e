package plugin_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
)

func TestPluginCommandServesExample(t *testing.T) {
	k := dptest.NewKubelet(t)
	ctx, cancel := context.WithCancel(context.Background())
	cfg, err := config.LoadPluginConfig("../../../examples/fake.yaml", "--config")
	if err != nil {
		t.Fatal(err)
	}
	cfg.PluginDir, cfg.Registration, cfg.MetricsAddress = k.PluginDir(), "kubelet", "127.0.0.1:0"
	type started struct {
		srv  *deviceplugin.Server
		addr string
	}
	startc := make(chan started, 1)
	done := make(chan error, 1)
	env := &cli.Env{Out: io.Discard, Err: io.Discard, Logger: slog.New(slog.DiscardHandler)}
	go func() {
		done <- pluginrun.Run(ctx, env.Logger, cfg, func(srv *deviceplugin.Server, addr string) { startc <- started{srv, addr} })
	}()
	st := <-startc
	k.WaitForDevices(t, "example.com/foo", dptest.Healthy(8))
	resp, err := k.Allocate(ctx, "example.com/foo", "dev-0", "dev-5")
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Envs[fake.EnvDevices]; got != "dev-0,dev-5" {
		t.Errorf("%s = %q", fake.EnvDevices, got)
	}
	k.Restart(t)
	k.WaitForRegistrations(t, "example.com/foo", 2)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := st.srv.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}

	if got := get(t, "http://"+st.addr+"/readyz", http.StatusOK); got != "ok\n" {
		t.Errorf("/readyz = %q", got)
	}
	get(t, "http://"+st.addr+"/healthz", http.StatusOK)
	metrics := get(t, "http://"+st.addr+"/metrics", http.StatusOK)
	for _, want := range []string{
		`dpkit_plugin_devices{health="healthy",resource="example.com/foo"} 8`,
		`dpkit_plugin_registered{resource="example.com/foo"} 1`,
		`dpkit_plugin_allocate_requests_total{code="OK",resource="example.com/foo"} 1`,
		`dpkit_plugin_reregistrations_total{reason=`,
		`dpkit_plugin_list_and_watch_message_bytes{resource="example.com/foo"}`,
		`process_resident_memory_bytes`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	socks, _ := filepath.Glob(filepath.Join(k.PluginDir(), "example_com_foo-*.sock"))
	if len(socks) != 0 {
		t.Errorf("sockets left after exit: %v", socks)
	}
}

func get(t *testing.T, url string, code int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != code {
		t.Errorf("GET %s = %d %s, want %d", url, resp.StatusCode, body, code)
	}
	return string(body)
}

func TestPluginCommandRejectsBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: foo\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"plugin"}, "--config is required"},
		{[]string{"plugin", "--config", filepath.Join(dir, "missing.yaml")}, "does not exist"},
		{[]string{"plugin", "--config", bad}, `plugins[0].fake.resources[0].name: Invalid value: "foo"`},
		{[]string{"plugin", "--config", "../../../examples/fake.yaml", "--registration", "sometimes"}, `registration: Unsupported value: "sometimes"`},
	} {
		err := app.Run(context.Background(), tc.args, nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || app.ExitCode(err) != 2 {
			t.Errorf("%v: err = %v (exit %d), want exit 2 and %q", tc.args, err, app.ExitCode(err), tc.want)
		}
	}
}
