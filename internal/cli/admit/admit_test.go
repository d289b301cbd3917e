package admit

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/internal/testdir"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeConfig is examples/fake.yaml with runtime options of every kind, so
// the table shows them all.
const fakeConfig = `apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
registration: kubelet
plugins:
- fake:
    resources:
    - name: example.com/foo
      count: 8
      allocate:
        devices: [{containerPath: "/dev/{id}", hostPath: /dev/null}]
        mounts: [{containerPath: /data, hostPath: /srv/foo, readOnly: true}]
        annotations: {example.com/foo-ids: "{ids}"}
        cdiDevices: ["example.com/foo={id}"]
`

// startNode runs an emulated kubelet and the fake plugin on a fresh root
// until the test ends, and returns the root once the plugin's 8 devices
// are allocatable.
func startNode(t *testing.T) string {
	t.Helper()
	root := testdir.Short(t, "adm")
	cfg, err := config.DecodePluginConfig([]byte(fakeConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg.PluginDir = filepath.Join(root, "device-plugins")

	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *emulator.Emulator, 1)
	kubeletDone, pluginDone := make(chan error, 1), make(chan error, 1)
	go func() {
		kubeletDone <- emulator.Run(ctx, emulator.Options{Root: root}, func(e *emulator.Emulator) { started <- e })
	}()
	t.Cleanup(func() {
		cancel()
		for _, ch := range []chan error{kubeletDone, pluginDone} {
			if err := <-ch; err != nil {
				t.Errorf("stopping: %v", err)
			}
		}
	})
	var e *emulator.Emulator
	select {
	case e = <-started:
	case err := <-kubeletDone:
		pluginDone <- nil
		t.Fatalf("emulator.Run: %v", err)
	}
	go func() { pluginDone <- pluginrun.Run(ctx, slog.New(slog.DiscardHandler), cfg, nil) }()

	updates, unsub := e.Manager().Subscribe()
	defer unsub()
	deadline := time.After(30 * time.Second)
	for {
		for _, r := range e.Manager().Resources() {
			if r.Name == "example.com/foo" && r.Allocatable == 8 {
				return root
			}
		}
		select {
		case <-updates:
		case err := <-pluginDone:
			pluginDone <- err
			t.Fatalf("pluginrun.Run ended: %v", err)
		case <-deadline:
			t.Fatalf("example.com/foo never had 8 allocatable devices: %+v", e.Manager().Resources())
		}
	}
}

// run runs "dpkit admit" with args and stdin, and returns its output and
// exit code.
func run(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := &cli.Env{In: strings.NewReader(stdin), Out: &out, Err: &out, Logger: slog.New(slog.DiscardHandler)}
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func podYAML(name string, n int) string {
	return strings.NewReplacer("NAME", name, "N", string(rune('0'+n))).Replace(
		"apiVersion: v1\nkind: Pod\nmetadata: {name: NAME}\nspec:\n  containers:\n  - name: main\n    resources: {limits: {example.com/foo: N}}\n")
}

func TestAdmit(t *testing.T) {
	root := startNode(t)
	example := filepath.Join("..", "..", "..", "examples")
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()

	tests := []struct {
		name  string
		stdin string
		args  []string
		code  int
		// want are regular expressions the output (or the error) matches.
		want []string
		// check inspects the JSON output.
		check func(t *testing.T, p *emulator.Pod)
		// remove is the pod to delete after the case.
		remove string
	}{
		{
			name: "table", args: []string{"-f", filepath.Join(example, "pod.yaml")}, remove: "demo",
			want: []string{
				`(?m)^pod default/demo admitted \(uid [0-9a-f-]{36}\)$`,
				`(?m)^CONTAINER +TYPE +DEVICES +RUNTIME OPTIONS$`,
				`(?m)^setup +init +example\.com/foo: dev-\d +env DPKIT_FAKE_DEVICES=dev-\d$`,
				`(?m)^main +app +example\.com/foo: dev-\d,dev-\d +env DPKIT_FAKE_DEVICES=dev-\d,dev-\d$`,
				`(?m)^ +device /dev/null:/dev/dev-\d:rw$`,
				`(?m)^ +mount /srv/foo:/data:ro$`,
				`(?m)^ +annotation example\.com/foo-ids=dev-\d,dev-\d$`,
				`(?m)^ +cdi example\.com/foo=dev-\d$`,
			},
		},
		{
			name: "json with a sidecar", args: []string{"-f", filepath.Join(example, "pod-sidecar.yaml"), "-o", "json"}, remove: "with-sidecar",
			check: func(t *testing.T, p *emulator.Pod) {
				if p.Namespace != "default" || p.Name != "with-sidecar" || len(p.Containers) != 2 {
					t.Fatalf("pod %+v, want default/with-sidecar with 2 containers", p)
				}
				seen := map[string]bool{}
				for i, want := range []struct {
					name, typ string
					n         int
				}{{"proxy", emulator.ContainerTypeSidecar, 1}, {"main", emulator.ContainerTypeApp, 2}} {
					c := p.Containers[i]
					if c.Name != want.name || c.Type != want.typ || len(c.Devices) != 1 || len(c.Devices[0].DeviceIDs) != want.n || c.Options == nil {
						t.Fatalf("container %d = %+v, want %s (%s) with %d devices and options", i, c, want.name, want.typ, want.n)
					}
					ids := c.Devices[0].DeviceIDs
					if env := c.Options.Envs; len(env) != 1 || env[0].Name != "DPKIT_FAKE_DEVICES" || env[0].Value != strings.Join(ids, ",") {
						t.Errorf("container %s envs %+v, want DPKIT_FAKE_DEVICES=%s", c.Name, env, strings.Join(ids, ","))
					}
					if len(c.Options.Devices) != want.n || len(c.Options.CDIDevices) != want.n || len(c.Options.Mounts) != 1 {
						t.Errorf("container %s options %+v, want %d devices, %d CDI devices and a mount", c.Name, c.Options, want.n, want.n)
					}
					for _, id := range ids {
						if seen[id] {
							t.Errorf("device %s given to the sidecar and the app container", id)
						}
						seen[id] = true
					}
				}
			},
		},
		{
			name: "yaml from stdin", stdin: podYAML("from-stdin", 3), args: []string{"-f", "-", "-o", "yaml"}, remove: "from-stdin",
			want: []string{`(?m)^name: from-stdin$`, `(?m)^  type: app$`, `(?m)^    - dev-\d$`, `(?m)^    - name: DPKIT_FAKE_DEVICES$`},
		},
		{
			name: "more devices than there are", args: []string{"-f", filepath.Join(example, "pod-too-many.yaml")}, code: exitRejected,
			want: []string{`^pod default/too-many rejected by the kubelet: UnexpectedAdmissionError: Allocate failed due to requested number of devices unavailable for example\.com/foo\. Requested: 9, Available: 8, which is unexpected$`},
		},
		{
			name: "invalid manifest", stdin: "metadata: {name: Bad_Name}\nspec: {containers: [{name: a, resources: {limits: {example.com/foo: 500m}}}, {name: a}]}\n",
			args: []string{"-f", "-"}, code: exitInvalid,
			want: []string{`metadata\.name: Invalid value: "Bad_Name"`, `spec\.containers\[0\]\.resources\.limits\[example\.com/foo\]: Invalid value: "500m"`, `spec\.containers\[1\]\.name: Duplicate value: "a"`},
		},
		{
			name: "unknown field", stdin: "metadata: {name: a}\nspec: {containers: [{name: a, resourcez: {}}]}\n", args: []string{"-f", "-"}, code: exitInvalid,
			want: []string{`^decoding pod manifest: unknown field "spec\.containers\[0\]\.resourcez"$`},
		},
		{
			name: "not a pod", stdin: "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\n", args: []string{"-f", "-"}, code: exitInvalid,
			want: []string{`kind: "Deployment" is not Pod`},
		},
		{name: "no -f", code: exitInvalid, want: []string{`-f is required`}},
		{name: "missing file", args: []string{"-f", "nope.yaml"}, code: exitInvalid, want: []string{`-f nope\.yaml: the file does not exist`}},
		{name: "bad output", args: []string{"-f", "-", "-o", "wide"}, code: exitInvalid, want: []string{`"wide" is not a format; use table, json or yaml`}},
		{
			name: "no kubelet", stdin: podYAML("x", 1), args: []string{"-f", "-", "--admin-socket", filepath.Join(root, "nothing.sock")}, code: exitRejected,
			want: []string{`admin API at .*nothing\.sock: .*is "dpkit kubelet" or "dpkit up" running with this root\?`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--root", root}, tc.args...)
			out, err := run(t, tc.stdin, args...)
			if code := cli.ExitCode(err); code != tc.code {
				t.Fatalf("exit code %d, want %d; output:\n%s\nerror: %v", code, tc.code, out, err)
			}
			if err != nil {
				out = err.Error()
			}
			for _, w := range tc.want {
				if !regexp.MustCompile(w).MatchString(out) {
					t.Errorf("output does not match %s:\n%s", w, out)
				}
			}
			if tc.check != nil {
				var p emulator.Pod
				if err := json.Unmarshal([]byte(out), &p); err != nil {
					t.Fatalf("output is not JSON: %v\n%s", err, out)
				}
				tc.check(t, &p)
			}
			if tc.remove != "" {
				if _, err := c.DeletePod(context.Background(), "default", tc.remove); err != nil {
					t.Fatal(err)
				}
			}
		})
	}

	// A second admission of the same pod is refused.
	if _, err := run(t, "", "--root", root, "-f", filepath.Join(example, "pod.yaml")); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "", "--root", root, "-f", filepath.Join(example, "pod.yaml"))
	if code := cli.ExitCode(err); code != exitRejected || !strings.Contains(err.Error(), "pod default/demo already exists; delete it first") {
		t.Errorf("second admission: exit code %d, error %v, output %s; want %d and already exists", code, err, out, exitRejected)
	}
}

// TestPrint checks the table of a pod without devices and one whose
// options outnumber its devices.
func TestPrint(t *testing.T) {
	t.Parallel()
	pod := &emulator.Pod{Namespace: "ml", Name: "p", UID: "u", Containers: []emulator.Container{
		{Name: "plain", Type: emulator.ContainerTypeApp},
		{Name: "gpu", Type: emulator.ContainerTypeApp,
			Devices: []emulator.Allocation{{Resource: "example.com/a", DeviceIDs: []string{"a0"}}, {Resource: "example.com/b", DeviceIDs: []string{"b0", "b1"}}},
			Options: &emulator.RuntimeOptions{Envs: []emulator.KeyValue{{Name: "A", Value: "a0"}}, Mounts: []emulator.Mount{{ContainerPath: "/c", HostPath: "/h"}}, CDIDevices: []string{"example.com/b=b0"}}},
	}}
	var out bytes.Buffer
	if err := printPod(&out, pod, "table"); err != nil {
		t.Fatal(err)
	}
	want := `pod ml/p admitted (uid u)

CONTAINER  TYPE  DEVICES               RUNTIME OPTIONS
plain      app   -                     -
gpu        app   example.com/a: a0     env A=a0
                 example.com/b: b0,b1  mount /h:/c
                                       cdi example.com/b=b0
`
	if got := out.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

// TestPrintQuotesOddIDs checks that device IDs with a control character or
// a path separator are shown quoted, so that they cannot garble the table.
func TestPrintQuotesOddIDs(t *testing.T) {
	t.Parallel()
	pod := &emulator.Pod{Namespace: "ml", Name: "p", UID: "u", Containers: []emulator.Container{
		{Name: "gpu", Type: emulator.ContainerTypeApp,
			Devices: []emulator.Allocation{{Resource: "example.com/a", DeviceIDs: []string{"a0", "a1\n", "MIG-1/0"}}}},
	}}
	var out bytes.Buffer
	if err := printPod(&out, pod, "table"); err != nil {
		t.Fatal(err)
	}
	if want := `gpu        app   example.com/a: a0,"a1\n","MIG-1/0"  -`; !strings.Contains(out.String(), want) {
		t.Errorf("table:\n%s\nlacks %q", out.String(), want)
	}
	out.Reset()
	if err := printPod(&out, pod, "json"); err != nil {
		t.Fatal(err)
	}
	if want := `"a1\n"`; !strings.Contains(out.String(), want) {
		t.Errorf("JSON output changed the ID:\n%s", out.String())
	}
}

// TestAdmitUnservedResource checks a pod asking for a resource no plugin
// serves (a typo): admitted, as a kubelet admits it, with a warning in
// the table, in JSON and on standard error.
func TestAdmitUnservedResource(t *testing.T) {
	root := startNode(t)
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	manifest := "metadata: {name: typo}\nspec:\n  initContainers: [{name: init, resources: {requests: {cpu: 1}}}]\n  containers:\n  - {name: main, resources: {limits: {example.com/foo: 1, example.com/fooo: 2}}}\n"
	want := "spec.containers[0].resources.limits[example.com/fooo]: no device plugin serves example.com/fooo, so the pod was admitted without devices for it, as a kubelet admits it; resources served: example.com/foo"
	for _, format := range []string{"table", "json"} {
		t.Run(format, func(t *testing.T) {
			var out, errOut bytes.Buffer
			cmd := NewCommand(&cli.Env{In: strings.NewReader(manifest), Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler)})
			cmd.SetArgs([]string{"--root", root, "-f", "-", "-o", format})
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			if err := cmd.ExecuteContext(context.Background()); err != nil {
				t.Fatalf("admit: %v\n%s", err, out.String())
			}
			defer func() {
				if _, err := c.DeletePod(context.Background(), "default", "typo"); err != nil {
					t.Fatal(err)
				}
			}()
			if got := errOut.String(); got != "Warning: "+want+"\n" {
				t.Errorf("standard error %q, want the warning alone", got)
			}
			switch format {
			case "table":
				if !strings.HasSuffix(out.String(), "\nWARNING  "+want+"\n") || !regexp.MustCompile(`(?m)^main +app +example\.com/foo: dev-\d +env`).MatchString(out.String()) {
					t.Errorf("table:\n%s\nwant the served device and a WARNING row %q", out.String(), want)
				}
			case "json":
				var p emulator.Pod
				if err := json.Unmarshal(out.Bytes(), &p); err != nil || len(p.Warnings) != 1 || p.Warnings[0] != want {
					t.Errorf("JSON warnings %q (%v), want [%q]", p.Warnings, err, want)
				}
			}
		})
	}
	// A pod asking only for what is served has none.
	var out, errOut bytes.Buffer
	cmd := NewCommand(&cli.Env{In: strings.NewReader(podYAML("fine", 1)), Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler)})
	cmd.SetArgs([]string{"--root", root, "-f", "-"})
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.ExecuteContext(context.Background()); err != nil || errOut.Len() != 0 || strings.Contains(out.String(), "WARNING") {
		t.Errorf("admit of a served resource: %v, stderr %q, output:\n%s", err, errOut.String(), out.String())
	}
}
