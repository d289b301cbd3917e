package plugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
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
		done <- pluginrun.Run(ctx, env.Logger, cfg, func(s pluginrun.Served) { startc <- started{s.Server, s.MetricsAddr} })
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
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	// The kubelet serves the plugin before its Register call returns; a
	// restart before the plugin has the answer ends that call, and the
	// plugin's retry of it (no re-registration) is what the kubelet sees.
	if err := st.srv.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	k.Restart(t)
	k.WaitForRegistrations(t, "example.com/foo", 2)
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
		// A problem with a value a flag set is named by the flag.
		{[]string{"plugin", "--config", "../../../examples/fake.yaml", "--registration", "sometimes"}, "with flags:\n1 problem(s):\n  - --registration: Unsupported value: \"sometimes\""},
		{[]string{"plugin", "--config", "../../../examples/fake.yaml", "--plugin-dir", "dp"}, `--plugin-dir: Invalid value: "dp": must be an absolute path`},
		{[]string{"plugin", "--config", "../../../examples/fake.yaml", "-o", "json"}, "--output: Forbidden: applies only to --validate"},
		{[]string{"plugin", "--config", "../../../examples/fake.yaml", "--validate", "-o", "xml"}, `"xml" is not a format; use table, json or yaml`},
	} {
		err := app.Run(context.Background(), tc.args, nil, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) || app.ExitCode(err) != 2 {
			t.Errorf("%v: err = %v (exit %d), want exit 2 and %q", tc.args, err, app.ExitCode(err), tc.want)
		}
	}
}

// TestPluginValidate checks --validate: it serves nothing, prints what
// would be served and where it would register, and exits 0, 1 when the
// machine is not ready for a valid config, 2 when the config is wrong.
func TestPluginValidate(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	pluginDir := filepath.Join(root, "device-plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(root, "zero.yaml")
	if err := os.WriteFile(zero, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources:\n    - name: example.com/foo\n      count: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	example := "../../../examples/fake.yaml"
	for _, tc := range []struct {
		name string
		args []string
		code int
		out  string // the whole output, when the exit code is 0
		err  string // a part of the error, otherwise
	}{
		{"valid", []string{"--config", example, "--plugin-dir", pluginDir}, 0,
			"config OK: 1 plugin: fake (example.com/foo)\n  example.com/foo: deviceplugin\nregistration: kubelet, through " + filepath.Join(pluginDir, "kubelet.sock") + "\n", ""},
		{"json", []string{"--config", example, "--plugin-dir", pluginDir, "--registration", "kubelet", "-o", "json"}, 0,
			`{
  "plugins": [
    {
      "kind": "fake",
      "resources": [
        "example.com/foo"
      ]
    }
  ],
  "pluginDir": "` + pluginDir + `",
  "registration": "kubelet",
  "registryDir": "` + filepath.Join(root, "plugins_registry") + `",
  "resources": [
    {
      "kind": "fake",
      "resource": "example.com/foo",
      "fronts": [
        "deviceplugin"
      ],
      "driverName": "foo.example.com",
      "deviceClass": "foo.example.com"
    }
  ]
}
`, ""},
		{"no plugin directory", []string{"--config", example, "--plugin-dir", filepath.Join(root, "nope")}, 1, "",
			"the config is valid, but this machine is not ready for it:\n1 problem(s):\n  - --plugin-dir: Invalid value: \"" + filepath.Join(root, "nope") + "\": no such directory on this machine"},
		{"no registry directory", []string{"--config", example, "--plugin-dir", pluginDir, "--registration", "registry"}, 1, "",
			"  - registryDir: Invalid value: \"" + filepath.Join(root, "plugins_registry") + "\": no such directory on this machine"},
		{"count 0", []string{"--config", zero, "--plugin-dir", pluginDir}, 2, "",
			"1 problem(s):\n  - plugins[0].fake.resources[0].count: Invalid value: 0: an explicit zero is not a setting here; leave the field out for the default, 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := app.Run(context.Background(), append([]string{"plugin", "--validate"}, tc.args...), nil, &out, io.Discard)
			if code := app.ExitCode(err); code != tc.code {
				t.Fatalf("exit %d (%v), want %d", code, err, tc.code)
			}
			if tc.code == 0 && out.String() != tc.out {
				t.Errorf("printed\n%s\nwant\n%s", out.String(), tc.out)
			}
			if tc.code != 0 && (!strings.Contains(err.Error(), tc.err) || out.Len() != 0) {
				t.Errorf("error %q, printed %q; want the error to contain %q and nothing printed", err, out.String(), tc.err)
			}
		})
	}
	// Nothing was served: no socket in the plugin directory.
	if entries, err := os.ReadDir(pluginDir); err != nil || len(entries) != 0 {
		t.Errorf("plugin directory holds %v (%v) after --validate", entries, err)
	}
}

// TestPluginValidateDirFromEnvironment checks that with no --plugin-dir
// the plugin serves where $DPKIT_PLUGIN_DIR says, as the SDK does when
// dpkit verify runs "dpkit plugin".
func TestPluginValidateDirFromEnvironment(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("DPKIT_PLUGIN_DIR", dir)
	var out bytes.Buffer
	err := app.Run(context.Background(), []string{"plugin", "--validate", "--config", "../../../examples/fake.yaml", "--registration", "kubelet", "-o", "json"}, nil, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := `"pluginDir": "` + dir + `"`; !strings.Contains(out.String(), want) {
		t.Errorf("--validate printed\n%s\nwant %s", out.String(), want)
	}
}

// TestPluginValidateEnvironment checks that --validate prints the
// directories and the node the plugin would use, whatever sets them: the
// environment ($DPKIT_PLUGIN_DIR, $DPKIT_REGISTRY_DIR, $DPKIT_DRA_PLUGINS_DIR,
// $DPKIT_CDI_DIR, $NODE_NAME), the flags over it, or nothing (the kubelet's).
func TestPluginValidateEnvironment(t *testing.T) {
	root := t.TempDir()
	dir := func(name string) string {
		d := filepath.Join(root, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	envPluginDir, envRegistryDir, flagPluginDir := dir("env/device-plugins"), dir("env/registry"), dir("flag/device-plugins")
	envDRADir, envCDIDir := filepath.Join(root, "env/plugins"), filepath.Join(root, "env/cdi")
	cfg := filepath.Join(root, "dra.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake:\n    resources: [{name: example.com/foo}, {name: example.com/bar}]\n  fronts: [deviceplugin, dra]\n- nvidia: {}\nhost: {sysfsRoot: /, devRoot: /, procRoot: /}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// With a dra section that sets the directories, the environment's
	// are not used (as pluginrun does).
	own := filepath.Join(root, "own.yaml")
	if err := os.WriteFile(own, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake: {resources: [{name: example.com/foo}]}\n  fronts: [dra]\ndra: {pluginsDir: /own/plugins, cdiDir: /own/cdi, nodeName: own}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const head = "config OK: 2 plugins: fake (example.com/foo, example.com/bar), nvidia (nvidia.com/gpu)\n" +
		"  example.com/foo: deviceplugin, dra (driver foo.example.com, DeviceClass foo.example.com)\n" +
		"  example.com/bar: deviceplugin, dra (driver bar.example.com, DeviceClass bar.example.com)\n" +
		"  nvidia.com/gpu: deviceplugin\n"
	set := map[string]string{
		"DPKIT_PLUGIN_DIR": envPluginDir, "DPKIT_REGISTRY_DIR": envRegistryDir,
		"DPKIT_DRA_PLUGINS_DIR": envDRADir, "DPKIT_CDI_DIR": envCDIDir, "NODE_NAME": "node-7",
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"environment", set, []string{"--config", cfg},
			head + "dra: node node-7, plugins in " + envDRADir + ", CDI specs in " + envCDIDir + "\n" +
				"registration: registry, in " + envRegistryDir + "\n"},
		{"flags over the environment", set, []string{"--config", cfg, "--plugin-dir", flagPluginDir, "--registration", "kubelet"},
			head + "dra: node node-7, plugins in " + envDRADir + ", CDI specs in " + envCDIDir + "\n" +
				"registration: kubelet, through " + filepath.Join(flagPluginDir, "kubelet.sock") + "\n"},
		{"the file over the environment", set, []string{"--config", own, "--registration", "kubelet"},
			"config OK: 1 plugin: fake (example.com/foo)\n  example.com/foo: dra (driver foo.example.com, DeviceClass foo.example.com)\n" +
				"dra: node own, plugins in /own/plugins, CDI specs in /own/cdi\n" +
				"registration: kubelet, through " + filepath.Join(envPluginDir, "kubelet.sock") + "\n"},
		{"nothing set", nil, []string{"--config", cfg, "--plugin-dir", flagPluginDir, "--registration", "kubelet"},
			// The plugins directory beside the device plugin directory
			// given, as the registry directory.
			head + "dra: node $NODE_NAME (not set here), plugins in " + filepath.Join(filepath.Dir(flagPluginDir), "plugins") + ", CDI specs in /var/run/cdi\n" +
				"registration: kubelet, through " + filepath.Join(flagPluginDir, "kubelet.sock") + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k := range set {
				t.Setenv(k, tc.env[k])
			}
			var out bytes.Buffer
			if err := app.Run(context.Background(), append([]string{"plugin", "--validate"}, tc.args...), nil, &out, io.Discard); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want {
				t.Errorf("printed\n%s\nwant\n%s", out.String(), tc.want)
			}
		})
	}

	// And in JSON, the dra section as used.
	for k, v := range set {
		t.Setenv(k, v)
	}
	var out bytes.Buffer
	if err := app.Run(context.Background(), []string{"plugin", "--validate", "--config", cfg, "-o", "json"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	var got struct {
		PluginDir, RegistryDir string
		DRA                    struct{ PluginsDir, CDIDir, NodeName string }
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.PluginDir != envPluginDir || got.RegistryDir != envRegistryDir || got.DRA.PluginsDir != envDRADir || got.DRA.CDIDir != envCDIDir || got.DRA.NodeName != "node-7" {
		t.Errorf("--validate -o json printed\n%s\nwant the environment's directories and node", out.String())
	}
}

// TestPluginHelpDefaults checks that --help shows the defaults the plugin
// applies: the registry directory follows --plugin-dir.
func TestPluginHelpDefaults(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	if err := app.Run(context.Background(), []string{"plugin", "--help"}, nil, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"kubelet device plugin directory (default $DPKIT_PLUGIN_DIR, else /var/lib/kubelet/device-plugins)",
		"kubelet plugin watcher directory (default: plugins_registry beside --plugin-dir, /var/lib/kubelet/plugins_registry for the default --plugin-dir)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
}

// TestPluginRefusesDRAFront: dpkit hands a config that asks for the dra
// front over to dpkit-cluster, and without one says how to get it (exit
// 1), serving nothing; a binary without a DRA front refuses it with what
// to do; --validate says where it will be served.
func TestPluginRefusesDRAFront(t *testing.T) {
	// No dpkit-cluster on PATH.
	t.Setenv("PATH", t.TempDir())
	root := t.TempDir()
	pluginDir := filepath.Join(root, "device-plugins")
	if err := os.Mkdir(pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(root, "dra.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fake: {resources: [{name: example.com/foo}]}\n- fake: {resources: [{name: example.com/bar}]}\n  fronts: [dra]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	args := []string{"plugin", "--config", cfg, "--plugin-dir", pluginDir, "--registration", "kubelet"}
	err := app.Run(context.Background(), args, nil, &out, &errOut)
	if want := "dpkit plugin needs dpkit-cluster"; err == nil || !strings.Contains(err.Error(), want) || app.ExitCode(err) != 1 {
		t.Errorf("err = %v (exit %d), want exit 1 and %q", err, app.ExitCode(err), want)
	}
	err = app.Run(context.Background(), args, nil, &out, &errOut, app.WithCluster(noDRA{}))
	want := "plugins[1].fronts: the DRA front is not available in this build of dpkit"
	if err == nil || !errors.Is(err, pluginrun.ErrNoDRAFront) || !strings.Contains(err.Error(), want) || app.ExitCode(err) != 1 {
		t.Errorf("err = %v (exit %d), want exit 1 and %q", err, app.ExitCode(err), want)
	}
	if entries, err := os.ReadDir(pluginDir); err != nil || len(entries) != 0 {
		t.Errorf("plugin directory holds %v (%v)", entries, err)
	}

	out.Reset()
	errOut.Reset()
	if err := app.Run(context.Background(), []string{"plugin", "--validate", "--config", cfg, "--plugin-dir", pluginDir}, nil, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "  example.com/bar: dra (driver bar.example.com, DeviceClass bar.example.com)\n") ||
		!strings.Contains(errOut.String(), "dpkit plugin hands this config over to dpkit-cluster") {
		t.Errorf("--validate printed\n%s\nand on stderr\n%s", out.String(), errOut.String())
	}
}

// noDRA is a cli.Cluster of a build without a DRA front.
type noDRA struct{}

func (noDRA) PodHealth(string) (cli.PodHealthGetter, error) { return nil, errors.New("no API server") }
func (noDRA) DRAFront() pluginrun.DRAFront                  { return nil }
func (noDRA) DRA(string) (cli.DRAReader, error)             { return nil, errors.New("no API server") }

// TestPluginServesReplicasAlone: a resource served through the device
// plugin API alone offers the kubelet the replicas of a shared device,
// not the device they are shares of (it would count twice).
func TestPluginServesReplicasAlone(t *testing.T) {
	k := dptest.NewKubelet(t)
	cfg, err := config.DecodePluginConfig([]byte(`apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resources:
    - name: example.com/gpu
      count: 2
      capacity: {memory: 80Gi}
      shared: {memory: {min: 1Gi, step: 1Gi}}
      replicas: 4
`))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Default()
	cfg.PluginDir, cfg.Registration = k.PluginDir(), "kubelet"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pluginrun.Run(ctx, nil, cfg, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	devs := k.WaitForDevices(t, "example.com/gpu", dptest.Healthy(8))
	for _, d := range devs {
		if !strings.Contains(d.ID, "::") {
			t.Errorf("offered %s, a shared device whose replicas are offered", d.ID)
		}
	}
}
