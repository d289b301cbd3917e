package up

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/syncbuf"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/topology"
)

// helperEnv, set in a process's environment, makes the test binary run
// "dpkit up" with the arguments it holds (separated by \x1f) instead of the
// tests: a real process for the tests that need two.
const helperEnv = "DPKIT_UP_TEST_PROCESS"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(helperEnv); ok {
		os.Exit(runHelper(strings.Split(args, "\x1f")))
	}
	goleak.VerifyTestMain(m)
}

// runHelper runs "dpkit up" with args until SIGTERM and returns its exit
// code.
func runHelper(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	env := &cli.Env{In: os.Stdin, Out: os.Stdout, Err: os.Stderr, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
	}
	return cli.ExitCode(err)
}

// TestEmbeddedExamples keeps the embedded defaults equal to the examples
// the docs show.
func TestEmbeddedExamples(t *testing.T) {
	t.Parallel()
	for name, embedded := range map[string][]byte{"fake.yaml": defaultConfig, "pod.yaml": examplePod} {
		want, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(embedded, want) {
			t.Errorf("internal/cli/up/%s differs from examples/%s; copy it over", name, name)
		}
	}
}

// upRun is "dpkit up" running in this process.
type upRun struct {
	t *testing.T
	// getenv is the run's environment: XDG_STATE_HOME, where it records
	// its root, is a fresh directory.
	getenv func(string) string
	lines  chan string
	done   chan error
	cancel context.CancelFunc
	seen   []string
	// logs is what the run logged (warnings and errors: "dpkit up" logs
	// no lower without --log-level).
	logs *syncbuf.Buffer
}

func startUp(t *testing.T, args ...string) *upRun {
	t.Helper()
	return start(t, func(ctx context.Context, env *cli.Env) error {
		cmd := NewCommand(env)
		cmd.SetArgs(append(args, "--numa-nodes", "0")) // exercises the pass-through; policy none ignores it
		cmd.SetOut(env.Out)
		cmd.SetErr(env.Out)
		cmd.SilenceUsage, cmd.SilenceErrors = true, true
		return cmd.ExecuteContext(ctx)
	})
}

// start runs "dpkit up" through run, with an environment whose output
// the returned upRun reads and whose logs it keeps.
func start(t *testing.T, run func(context.Context, *cli.Env) error) *upRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	state := t.TempDir()
	u := &upRun{t: t, lines: make(chan string, 100), done: make(chan error, 1), cancel: cancel, logs: &syncbuf.Buffer{},
		getenv: func(k string) string { return map[string]string{"XDG_STATE_HOME": state}[k] }}
	go func() {
		defer close(u.lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			u.lines <- sc.Text()
		}
	}()
	env := &cli.Env{In: strings.NewReader(""), Out: pw, Err: u.logs, Logger: slog.New(slog.NewTextHandler(u.logs, nil)), Getenv: u.getenv}
	go func() {
		err := run(ctx, env)
		_ = pw.Close()
		u.done <- err
	}()
	t.Cleanup(func() {
		cancel()
		for range u.lines {
		}
		if t.Failed() {
			t.Logf("output:\n%s\nlogs:\n%s", strings.Join(u.seen, "\n"), u.logs.String())
		}
	})
	return u
}

// waitLine returns the first line starting with prefix.
func (u *upRun) waitLine(prefix string) string {
	u.t.Helper()
	return u.wait(prefix, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

// wait returns the first line that matches; what says what is awaited.
func (u *upRun) wait(what string, match func(string) bool) string {
	u.t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-u.lines:
			if !ok {
				u.t.Fatalf("dpkit up ended before printing %q", what)
			}
			u.seen = append(u.seen, l)
			if match(l) {
				return l
			}
		case <-deadline:
			u.t.Fatalf("dpkit up did not print %q within 30s", what)
		}
	}
}

// stop cancels the run, waits for it and returns the rest of its output.
func (u *upRun) stop() (string, error) {
	u.t.Helper()
	u.cancel()
	var rest []string
	for l := range u.lines {
		u.seen = append(u.seen, l)
		rest = append(rest, l)
	}
	select {
	case err := <-u.done:
		return strings.Join(rest, "\n"), err
	case <-time.After(30 * time.Second):
		u.t.Fatal("dpkit up did not stop within 30s")
	}
	return "", nil
}

func sockets(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSocket != 0 {
			out = append(out, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestUp(t *testing.T) {
	cfg := filepath.Join(testdir.Short(t, "up"), "three.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nregistration: registry\nplugins:\n- fake: {resources: [{name: example.com/bar, count: 3}]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		args      []string
		givenRoot bool
		resource  string
		devices   int64
		lines     []string // printed before ready, in order
		plugins   bool     // "get plugins" is suggested
		tooMany   bool     // a pod asking for too many devices is suggested
	}{
		{"default fake plugin in a given root", nil, true, "example.com/foo", 8,
			[]string{"registration        ", "plugins_registry    ", "PodResources API    ", "admin API           ", "checkpoint          ", "topology            policy none, NUMA nodes 0 (--numa-nodes)",
				"waiting for the plugins to register (kubelet)...", "plugin example.com/foo: 8 devices (8 healthy), registered through Register on kubelet.sock"}, false, false},
		{"config registering through plugins_registry in a temporary root", []string{"--config", cfg}, false, "example.com/bar", 3,
			[]string{"waiting for the plugins to register (registry)...", "plugin example.com/bar: 3 devices (3 healthy), registered through a socket in plugins_registry"}, true, true},
		{"flag overrides the config's registration", []string{"--config", cfg, "--registration", "kubelet"}, false, "example.com/bar", 3,
			[]string{"waiting for the plugins to register (kubelet)..."}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			root := ""
			if tc.givenRoot {
				root = testdir.Short(t, "up")
				args = append(args, "--root", root)
			}
			u := startUp(t, args...)
			rootLine := u.waitLine("root ")
			if got := strings.Fields(rootLine)[1]; tc.givenRoot && got != root {
				t.Fatalf("root line %q, want root %s", rootLine, root)
			} else {
				root = got
			}
			if !tc.givenRoot && !strings.Contains(rootLine, "(temporary: removed on exit; --keep keeps it)") {
				t.Errorf("root line %q does not say the root is temporary", rootLine)
			}
			for _, l := range tc.lines {
				u.waitLine(l)
			}
			if got, want := u.waitLine(readyPrefix), "ready: "+tc.resource+"="+strconv.FormatInt(tc.devices, 10)+" allocatable"; got != want {
				t.Errorf("ready line %q, want %q", got, want)
			}
			var suggested []string
			admitLine := u.wait("the admit command", func(l string) bool {
				suggested = append(suggested, l)
				return strings.Contains(l, " admit --root "+root+" -f ")
			})
			if got := strings.Contains(strings.Join(suggested, "\n"), " get plugins --root "+root); got != tc.plugins {
				t.Errorf("get plugins suggested: %t, want %t", got, tc.plugins)
			}
			var tooManyLine string
			u.wait("Stop with Ctrl-C.", func(l string) bool {
				if strings.Contains(l, " admit --root ") {
					tooManyLine = l
				}
				return l == "Stop with Ctrl-C."
			})

			// The client commands find the root without --root.
			if r := emulator.ChooseRoot("", false, u.getenv); r.Dir != root || r.From != emulator.FromRecorded {
				t.Errorf("the root chosen without --root is %+v, want %s recorded by dpkit up", r, root)
			}

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c := emulator.NewClient(emulator.AdminSocket(root))
			defer c.Close()
			rs, err := c.Resources(ctx)
			if err != nil || len(rs) != 1 || rs[0].Name != tc.resource || rs[0].Allocatable != tc.devices || !rs[0].Connected {
				t.Fatalf("Resources() = %+v, %v; want %s with %d allocatable", rs, err, tc.resource, tc.devices)
			}
			// The example the banner names admits, with devices of the
			// resource served and no warning, whatever the config.
			read := func(line string) []byte {
				t.Helper()
				file := strings.Fields(line)[5]
				if !filepath.IsAbs(file) {
					file = filepath.Join("..", "..", "..", file)
				}
				manifest, err := os.ReadFile(file)
				if err != nil {
					t.Fatal(err)
				}
				return manifest
			}
			pod, err := c.AdmitPod(ctx, read(admitLine))
			if err != nil {
				t.Fatalf("admitting %s: %v", admitLine, err)
			}
			got := 0
			for _, ctr := range pod.Containers {
				for _, a := range ctr.Devices {
					if a.Resource == tc.resource {
						got += len(a.DeviceIDs)
					}
				}
			}
			if got == 0 || len(pod.Warnings) != 0 {
				t.Errorf("the example pod got %d %s devices and warnings %q; want some devices and no warning", got, tc.resource, pod.Warnings)
			}
			// The pod asking for too many, when suggested, is rejected.
			if tc.tooMany != (tooManyLine != "") {
				t.Errorf("too-many pod suggested: %q, want %t", tooManyLine, tc.tooMany)
			}
			if tooManyLine != "" {
				var ae *emulator.APIError
				if _, err := c.AdmitPod(ctx, read(tooManyLine)); !errors.As(err, &ae) || ae.Reason != "UnexpectedAdmissionError" {
					t.Errorf("admitting %s: %v, want UnexpectedAdmissionError", tooManyLine, err)
				}
			}

			rest, err := u.stop()
			if err != nil {
				t.Fatalf("dpkit up returned %v", err)
			}
			if !strings.Contains(rest, "stopped") {
				t.Errorf("output after stop %q does not say stopped", rest)
			}
			if tc.givenRoot {
				if s := sockets(t, root); len(s) != 0 {
					t.Errorf("sockets left after stop: %v", s)
				}
				if _, err := os.Stat(filepath.Join(root, "device-plugins", "kubelet_internal_checkpoint")); err != nil {
					t.Errorf("checkpoint: %v", err)
				}
				return
			}
			if !strings.Contains(rest, "removed "+root) {
				t.Errorf("output after stop %q does not say %s was removed", rest, root)
			}
			if _, err := os.Stat(root); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("temporary root %s left behind: %v", root, err)
			}
		})
	}
}

func TestUpKeep(t *testing.T) {
	u := startUp(t, "--keep")
	root := strings.Fields(u.waitLine("root "))[1]
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	u.waitLine(readyPrefix)
	rest, err := u.stop()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rest, "kept "+root) {
		t.Errorf("output after stop %q does not say %s was kept", rest, root)
	}
	if s := sockets(t, root); len(s) != 0 {
		t.Errorf("sockets left after stop: %v", s)
	}
}

func TestUpErrors(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins: [{fake: {resources: [{name: foo}]}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad registration", []string{"--registration", "magic"}, `--registration: "magic" is not a registration path`},
		{"empty root", []string{"--root", ""}, "--root must not be empty"},
		{"bad topology policy", []string{"--topology-policy", "bogus"}, `--topology-policy: "bogus" is not a topology manager policy; use none, best-effort, restricted or single-numa-node`},
		{"missing config", []string{"--config", "nope.yaml"}, "--config nope.yaml: the file does not exist"},
		{"invalid config", []string{"--config", bad}, "plugins[0].fake.resources[0].name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			cmd := NewCommand(&cli.Env{Out: &out, Err: &out, Logger: slog.New(slog.DiscardHandler), Getenv: func(string) string { return "" }})
			cmd.SetArgs(tc.args)
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.ExecuteContext(context.Background())
			if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v (exit %d), want exit 2 and %q", err, cli.ExitCode(err), tc.want)
			}
			if out.Len() != 0 {
				t.Errorf("printed %q before failing", out.String())
			}
		})
	}
}

func TestCommandFor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bin := filepath.Join(dir, "dpkit")
	if err := os.WriteFile(bin, nil, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, exe, onPath, want string
	}{
		{"on PATH", bin, bin, "dpkit"},
		{"on PATH through a link", bin, link, "dpkit"},
		{"go run", "/tmp/go-build1234/b001/exe/dpkit", "", "go run ./cmd/dpkit"},
		{"another dpkit on PATH", "/opt/dpkit/bin/dpkit", bin, "/opt/dpkit/bin/dpkit"},
		{"a path to quote", "/home/me/my tools/dpkit", "", `'/home/me/my tools/dpkit'`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := commandFor(tc.exe, tc.onPath); got != tc.want {
				t.Errorf("commandFor(%q, %q) = %q, want %q", tc.exe, tc.onPath, got, tc.want)
			}
		})
	}
}

// TestUpSecondOnSameRoot runs "dpkit up --root R" as a real process, then
// a second "dpkit up --root R" in this one: the second fails naming the
// first, and leaves the first working (it still admits a pod, and its
// sockets are where they were).
func TestUpSecondOnSameRoot(t *testing.T) {
	root := testdir.Short(t, "up")
	first := exec.Command(os.Args[0], "-test.run=^$")
	first.Env = append(os.Environ(), helperEnv+"="+strings.Join([]string{"--root", root}, "\x1f"), "XDG_STATE_HOME="+t.TempDir())
	stdout, err := first.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	first.Stderr = &logs
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	stopFirst := func() error {
		if first.Process == nil {
			return nil
		}
		_ = first.Process.Signal(syscall.SIGTERM)
		for range lines {
		}
		err := first.Wait()
		first.Process = nil
		return err
	}
	t.Cleanup(func() {
		_ = stopFirst()
		if t.Failed() {
			t.Logf("first dpkit up's logs:\n%s", logs.String())
		}
	})
	ready := false
	for l := range lines {
		if strings.HasPrefix(l, readyPrefix) {
			ready = true
			break
		}
	}
	if !ready {
		t.Fatalf("the first dpkit up ended before it was ready: %v", stopFirst())
	}

	var out, errOut bytes.Buffer
	cmd := NewCommand(&cli.Env{Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler), Getenv: func(string) string { return "" }})
	cmd.SetArgs([]string{"--root", root})
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	// Bounded only so that a second dpkit up that starts (the bug) ends
	// the test instead of hanging it.
	second, cancelSecond := context.WithTimeout(context.Background(), 30*time.Second)
	err = cmd.ExecuteContext(second)
	cancelSecond()
	want := fmt.Sprintf("root %s is in use by pid %d (%s, started ", root, first.Process.Pid, strings.Join(first.Args, " "))
	if cli.ExitCode(err) != 1 || !strings.Contains(err.Error(), want) {
		t.Fatalf("second dpkit up: %v (exit %d), want exit 1 and %q with the first's command line", err, cli.ExitCode(err), want)
	}
	if out.Len() != 0 {
		t.Errorf("the second dpkit up printed %q before failing", out.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	pod, err := c.AdmitPod(ctx, []byte("metadata: {name: after}\nspec: {containers: [{name: a, resources: {limits: {example.com/foo: 2}}}]}\n"))
	if err != nil {
		t.Fatalf("the first dpkit up no longer admits: %v", err)
	}
	if n := len(pod.Containers[0].Devices); n != 1 || len(pod.Containers[0].Devices[0].DeviceIDs) != 2 {
		t.Errorf("admitted pod %+v, want 2 devices", pod)
	}
	for _, s := range []string{filepath.Join(root, "device-plugins", "kubelet.sock"), filepath.Join(root, "pod-resources", "kubelet.sock")} {
		if _, err := os.Stat(s); err != nil {
			t.Errorf("the first dpkit up's socket: %v", err)
		}
	}
	if err := stopFirst(); err != nil {
		t.Errorf("the first dpkit up exited with %v", err)
	}
}

// TestExamplePods checks which example pods are suggested: the checkout's
// when the fake plugin's resource is served, the embedded copy outside a
// checkout, and pods built from what is served otherwise.
func TestExamplePods(t *testing.T) {
	t.Parallel()
	checkout := filepath.Join("..", "..", "..")
	foo := []devicemanager.ResourceStatus{{Name: "example.com/foo", Capacity: 8, Allocatable: 8, Connected: true}}
	other := []devicemanager.ResourceStatus{
		{Name: "dpkit.io/serial", Connected: true},
		{Name: "dpkit.io/fuse", Capacity: 16, Allocatable: 16, Connected: true},
		{Name: "dpkit.io/tun", Capacity: 16, Allocatable: 16, Connected: true},
	}
	for _, tc := range []struct {
		name      string
		workDir   string
		resources []devicemanager.ResourceStatus
		want      examples // paths below root start with "ROOT/"
		contains  []string // in the pod written, if any
	}{
		{"checkout", checkout, foo, examples{Pod: examplePodFile, TooMany: exampleTooManyPodFile}, nil},
		{"elsewhere", t.TempDir(), foo, examples{Pod: "ROOT/dpkit/pod.yaml"}, []string{"example.com/foo: 2"}},
		{"too few devices for the example", checkout, []devicemanager.ResourceStatus{{Name: "example.com/foo", Capacity: 2, Allocatable: 2}},
			examples{Pod: "ROOT/dpkit/pod.yaml", TooMany: "ROOT/dpkit/pod-too-many.yaml"}, []string{"example.com/foo: 1"}},
		{"other resources", checkout, other, examples{Pod: "ROOT/dpkit/pod.yaml", TooMany: "ROOT/dpkit/pod-too-many.yaml"},
			[]string{"dpkit.io/fuse: 1", "dpkit.io/tun: 1"}},
		{"nothing allocatable", checkout, other[:1], examples{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			got, err := examplePods(root, tc.workDir, tc.resources)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.Pod = strings.Replace(want.Pod, "ROOT", root, 1)
			want.TooMany = strings.Replace(want.TooMany, "ROOT", root, 1)
			if got != want {
				t.Fatalf("examplePods = %+v, want %+v", got, want)
			}
			if len(tc.contains) == 0 {
				return
			}
			data, err := os.ReadFile(got.Pod)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := emulator.DecodePod(data); err != nil {
				t.Fatalf("the example pod is not valid: %v\n%s", err, data)
			}
			for _, s := range tc.contains {
				if !strings.Contains(string(data), s) {
					t.Errorf("example pod\n%s\nlacks %q", data, s)
				}
			}
			if strings.Contains(string(data), "serial") {
				t.Errorf("example pod asks for a resource without allocatable devices:\n%s", data)
			}
			if got.TooMany != "" {
				data, err := os.ReadFile(got.TooMany)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := emulator.DecodePod(data); err != nil || fits(data, tc.resources) {
					t.Errorf("the too-many pod (%v) fits:\n%s", err, data)
				}
			}
		})
	}
}

// TestUpCleanStopIsQuiet stops "dpkit up" as Ctrl-C does once its plugin
// is registered, in both registration modes, with the plugin's clock past
// the time it takes a kubelet's ListAndWatch stream that ends for a
// reason to register again: nothing is logged at WARN or above, since a
// clean stop is not a failure (docs/dpkit-up.md).
func TestUpCleanStopIsQuiet(t *testing.T) {
	for _, registration := range []string{"kubelet", "registry"} {
		t.Run(registration, func(t *testing.T) {
			// What a stop in the wrong order logs depends on which side
			// sees the other go first: stop it a few times.
			for range 10 {
				clk := clocktesting.NewFakeClock(time.Now())
				u := start(t, func(ctx context.Context, env *cli.Env) error {
					env.Logger = slog.New(slog.NewTextHandler(env.Err, &slog.HandlerOptions{Level: slog.LevelWarn}))
					return runUp(ctx, env, options{Registration: registration, clock: clk,
						Topology: cli.Topology{Policy: topology.PolicyNone, Scope: topology.ScopeContainer, NUMANodes: []int{0}, SysfsRoot: cli.DefaultSysfsRoot}})
				})
				u.waitLine("Stop with Ctrl-C.")
				// Long after the registration, as when a user stops it.
				clk.Step(time.Minute)
				rest, err := u.stop()
				if err != nil || !strings.Contains(rest, "stopped") {
					t.Fatalf("dpkit up returned %v after printing %q, want nil after stopped", err, rest)
				}
				if l := u.logs.String(); l != "" {
					t.Fatalf("a clean stop logged:\n%s", l)
				}
			}
		})
	}
}
