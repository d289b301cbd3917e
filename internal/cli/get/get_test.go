package get

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/goleak"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
	"github.com/dpkit/dpkit/pkg/podresources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// runKubelet runs an emulated kubelet on a fresh root for the test.
func runKubelet(t *testing.T) string {
	t.Helper()
	root, _ := runEmulator(t)
	return root
}

// runEmulator is runKubelet that also returns the emulator.
func runEmulator(t *testing.T) (string, *emulator.Emulator) {
	t.Helper()
	root := testdir.Short(t, "kg")
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan *emulator.Emulator, 1)
	done := make(chan error, 1)
	go func() {
		done <- emulator.Run(ctx, emulator.Options{Root: root}, func(e *emulator.Emulator) { started <- e })
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("kubelet: %v", err)
		}
	})
	select {
	case e := <-started:
		return root, e
	case err := <-done:
		t.Fatalf("kubelet: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("kubelet did not start")
	}
	return "", nil
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := runEnv(t, nil, args...)
	return out, err
}

// runEnv runs "dpkit get" with args and the environment vars (nothing
// else: no HOME, no XDG_STATE_HOME) and returns its standard output and
// error.
func runEnv(t *testing.T, vars map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &cli.Env{In: strings.NewReader(""), Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler),
		Getenv: func(k string) string { return vars[k] }}
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), errOut.String(), err
}

func TestGet(t *testing.T) {
	root := runKubelet(t)
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	if _, err := c.AdmitPod(context.Background(), []byte("metadata: {name: web, namespace: shop}\nspec: {containers: [{name: nginx}]}\n")); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		args     []string
		contains []string
		exit     int
	}{
		{[]string{"pods", "--root", root}, []string{"NAMESPACE  NAME  CONTAINER  RESOURCE  DEVICES  HEALTH  NUMA", "shop       web   nginx      -         -        -       -"}, 0},
		{[]string{"po", "--pod-resources-socket", podresources.SocketPath(root), "-o", "yaml"}, []string{"name: web", "namespace: shop"}, 0},
		{[]string{"resources", "--root", root, "-o", "json"}, []string{"[]"}, 0},
		{[]string{"devices", "--root", root, "-o", "yaml"}, []string{"[]"}, 0},
		{[]string{"plugins", "--root", root, "-o", "json"}, []string{`"registered": []`}, 0},
		{[]string{"gadgets", "--root", root}, nil, 2},
		{nil, nil, 2},
		{[]string{"resources", "--root", ""}, nil, 2},
		{[]string{"resources", "-n", "shop", "--root", root}, nil, 2},
		{[]string{"pods", "--root", root, "-o", "xml"}, nil, 2},
		{[]string{"pods", "--root", root + "/nowhere"}, nil, 1},
	}
	for _, tc := range tests {
		out, err := run(t, tc.args...)
		if code := cli.ExitCode(err); code != tc.exit {
			t.Errorf("get %v: exit %d (%v), want %d", tc.args, code, err, tc.exit)
			continue
		}
		for _, s := range tc.contains {
			if !strings.Contains(out, s) {
				t.Errorf("get %v output\n%s\ndoes not contain %q", tc.args, out, s)
			}
		}
	}

	out, err := run(t, "pods", "--root", root, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var pods []podRow
	if err := json.Unmarshal([]byte(out), &pods); err != nil || len(pods) != 1 || pods[0].Name != "web" || len(pods[0].Containers) != 1 {
		t.Errorf("get pods -o json = %s (%v), want the web pod", out, err)
	}
}

// TestPodsFromList checks the kubelet's one-entry-per-device answer is
// grouped per resource, sorted naturally (dev-3 before dev-10) and
// de-duplicated (a device on two NUMA nodes is listed twice), and pods
// are sorted naturally (y before y10).
func TestPodsFromList(t *testing.T) {
	numa := func(ids ...int64) *podresourcesv1.TopologyInfo {
		ti := &podresourcesv1.TopologyInfo{}
		for _, id := range ids {
			ti.Nodes = append(ti.Nodes, &podresourcesv1.NUMANode{ID: id})
		}
		return ti
	}
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		{Namespace: "b", Name: "z", Containers: []*podresourcesv1.ContainerResources{{Name: "c"}}},
		{Namespace: "a", Name: "y10", Containers: []*podresourcesv1.ContainerResources{{Name: "c"}}},
		{Namespace: "a", Name: "y", Containers: []*podresourcesv1.ContainerResources{{Name: "app", Devices: []*podresourcesv1.ContainerDevices{
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-3"}, Topology: numa(1)},
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-10"}},
			{ResourceName: "example.com/bar", DeviceIds: []string{"b0"}},
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-1"}, Topology: numa(0)},
			{ResourceName: "example.com/foo", DeviceIds: []string{"dev-3"}, Topology: numa(0)},
		}}}},
	}}
	got := podsFromList(resp)
	want := []podRow{
		{Namespace: "a", Name: "y", Containers: []containerRow{{Name: "app", Devices: []deviceGroup{
			{Resource: "example.com/bar", DeviceIDs: []string{"b0"}},
			{Resource: "example.com/foo", DeviceIDs: []string{"dev-1", "dev-3", "dev-10"}, NUMANodes: []int64{0, 1}},
		}}}},
		{Namespace: "a", Name: "y10", Containers: []containerRow{{Name: "c"}}},
		{Namespace: "b", Name: "z", Containers: []containerRow{{Name: "c"}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("PodsFromList =\n%+v\nwant\n%+v", got, want)
	}
}

// TestTablesQuoteOddIDs checks that a device ID with a control character
// or a path separator is shown quoted in the tables, so a newline cannot
// start a forged row, and kept as it is in JSON.
func TestTablesQuoteOddIDs(t *testing.T) {
	t.Parallel()
	odd := "dev-1\nexample.com/fake  dev-9  true"
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	writeDevices(tw, []emulator.Device{
		{Resource: "example.com/foo", ID: "dev-0", Healthy: true},
		{Resource: "example.com/foo", ID: odd, Healthy: true},
		{Resource: "example.com/foo", ID: "MIG-GPU-1/0/0", Healthy: false},
	})
	_ = tw.Flush()
	want := `RESOURCE         ID                                      HEALTHY  NUMA  POD
example.com/foo  dev-0                                   true     -     -
example.com/foo  "dev-1\nexample.com/fake  dev-9  true"  true     -     -
example.com/foo  "MIG-GPU-1/0/0"                         false    -     -
`
	if b.String() != want {
		t.Errorf("devices table:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	tw = tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	writePods(tw, []podRow{{Namespace: "ml", Name: "p", Containers: []containerRow{{Name: "c", Devices: []deviceGroup{
		{Resource: "example.com/foo", DeviceIDs: []string{"dev-0", "dev\x1b[2J"}},
	}}}}})
	_ = tw.Flush()
	if want := `ml         p     c          example.com/foo  dev-0,"dev\x1b[2J"  -`; !strings.Contains(b.String(), want) {
		t.Errorf("pods table:\n%s\nlacks %q", b.String(), want)
	}
}

// TestPodsHealthFromAdmin checks "get pods" on a dpkit kubelet's root
// shows each device's health from its admin API, as the pod's status
// would: Healthy, a device the plugin marks unhealthy, and Unknown once
// the plugin is gone.
func TestPodsHealthFromAdmin(t *testing.T) {
	root, e := runEmulator(t)
	devs := dptest.NewDevices("dev-0", "dev-1", "dev-2")
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: filepath.Join(root, "device-plugins")}, deviceplugin.Resource{Name: "example.com/foo", Plugin: devs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	stopPlugin := func() {
		if cancel != nil {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
			cancel = nil
		}
	}
	defer stopPlugin()
	mgr := e.Manager()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		ch, unsub := mgr.Subscribe()
		defer unsub()
		timeout := time.After(20 * time.Second)
		for !cond() {
			select {
			case <-ch:
			case <-timeout:
				t.Fatalf("timed out waiting for %s: %+v", what, mgr.Resources())
			}
		}
	}
	waitFor("3 devices", func() bool { _, a := mgr.Capacity(); return a["example.com/foo"] == 3 })
	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	pod, err := c.AdmitPod(context.Background(), []byte("metadata: {name: train, namespace: ml}\nspec: {containers: [{name: app, resources: {limits: {example.com/foo: 2}}}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ids := pod.Containers[0].Devices[0].DeviceIDs
	row := func(health string) string {
		return "ml         train  app        example.com/foo  " + strings.Join(ids, ",") + "  " + health
	}
	check := func(wantRow string, wantJSON map[string]string) {
		t.Helper()
		out, err := run(t, "pods", "--root", root)
		if err != nil || !strings.Contains(out, wantRow) {
			t.Errorf("get pods (%v):\n%s\nwant a row starting %q", err, out, wantRow)
		}
		out, err = run(t, "pods", "--root", root, "-o", "json")
		var pods []podRow
		if err == nil {
			err = json.Unmarshal([]byte(out), &pods)
		}
		if err != nil || len(pods) != 1 || !reflect.DeepEqual(pods[0].Containers[0].Devices[0].Health, wantJSON) {
			t.Errorf("get pods -o json (%v):\n%s\nwant health %v", err, out, wantJSON)
		}
	}
	check(row("Healthy,Healthy"), map[string]string{ids[0]: "Healthy", ids[1]: "Healthy"})

	devs.SetHealth(ids[1], false)
	waitFor(ids[1]+" unhealthy", func() bool { _, a := mgr.Capacity(); return a["example.com/foo"] == 2 })
	check(row("Healthy,Unhealthy"), map[string]string{ids[0]: "Healthy", ids[1]: "Unhealthy"})

	stopPlugin()
	waitFor("the plugin gone", func() bool { r := mgr.Resources(); return len(r) == 1 && !r[0].Connected })
	check(row("Unknown,Unknown"), map[string]string{ids[0]: "Unknown", ids[1]: "Unknown"})
}

// TestStatusHealth checks health read from pods' status in the API
// server: containers and init containers, by resource and ID, devices the
// status does not name left out, and pods the API server does not have
// left without health.
func TestStatusHealth(t *testing.T) {
	apiPods := map[string]cli.DeviceHealth{"ns/p": {
		"side": {"example.com/foo": {"s0": "Unknown"}},
		"app":  {"example.com/foo": {"d0": "Healthy", "d1": "Unhealthy"}},
	}}
	getHealth := func(_ context.Context, namespace, name string) (cli.DeviceHealth, error) {
		return apiPods[namespace+"/"+name], nil // nil: not found
	}
	pods := []podRow{
		{Namespace: "ns", Name: "p", Containers: []containerRow{
			{Name: "side", Devices: []deviceGroup{{Resource: "example.com/foo", DeviceIDs: []string{"s0"}}}},
			{Name: "app", Devices: []deviceGroup{
				{Resource: "example.com/bar", DeviceIDs: []string{"b0"}},
				{Resource: "example.com/foo", DeviceIDs: []string{"d0", "d1", "d2"}},
			}},
		}},
		{Namespace: "ns", Name: "gone", Containers: []containerRow{{Name: "app", Devices: []deviceGroup{{Resource: "example.com/foo", DeviceIDs: []string{"x"}}}}}},
	}
	if err := statusHealth(getHealth)(context.Background(), pods); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d          deviceGroup
		want       map[string]string
		wantColumn string
	}{
		{pods[0].Containers[0].Devices[0], map[string]string{"s0": "Unknown"}, "Unknown"},
		{pods[0].Containers[1].Devices[0], nil, "-"},
		{pods[0].Containers[1].Devices[1], map[string]string{"d0": "Healthy", "d1": "Unhealthy"}, "Healthy,Unhealthy,-"},
		{pods[1].Containers[0].Devices[0], nil, "-"},
	} {
		if !reflect.DeepEqual(tc.d.Health, tc.want) || tc.d.healthColumn() != tc.wantColumn {
			t.Errorf("%s %v: health %v (column %q), want %v (%q)", tc.d.Resource, tc.d.DeviceIDs, tc.d.Health, tc.d.healthColumn(), tc.want, tc.wantColumn)
		}
	}
}

// TestGetKubectlHabits checks what kubectl users expect: "No resources
// found" on standard error when there is nothing, names after the kind,
// natural order, pods shown by namespace/name, and the root chosen
// without --root.
func TestGetKubectlHabits(t *testing.T) {
	root, e := runEmulator(t)
	ids := make([]string, 11)
	for i := range ids {
		ids[i] = "dev-" + strconv.Itoa(i)
	}
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: filepath.Join(root, "device-plugins")},
		deviceplugin.Resource{Name: "example.com/foo", Plugin: dptest.NewDevices(ids...)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	ch, unsub := e.Manager().Subscribe()
	for _, a := e.Manager().Capacity(); a["example.com/foo"] != 11; _, a = e.Manager().Capacity() {
		<-ch
	}
	unsub()

	// Nothing admitted yet.
	out, errOut, err := runEnv(t, nil, "pods", "--root", root)
	if err != nil || out != "" || errOut != "No resources found\n" {
		t.Errorf("get pods with none: %v, stdout %q, stderr %q; want only \"No resources found\" on stderr", err, out, errOut)
	}

	c := emulator.NewClient(emulator.AdminSocket(root))
	defer c.Close()
	for _, m := range []string{
		"metadata: {name: web, namespace: shop}\nspec: {containers: [{name: nginx}]}\n",
		"metadata: {name: train, namespace: ml}\nspec: {containers: [{name: app, resources: {limits: {example.com/foo: 11}}}]}\n",
	} {
		if _, err := c.AdmitPod(context.Background(), []byte(m)); err != nil {
			t.Fatal(err)
		}
	}

	out, err = run(t, "devices", "--root", root)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 12 || !strings.HasPrefix(lines[3], "example.com/foo  dev-2 ") || !strings.HasPrefix(lines[11], "example.com/foo  dev-10 ") || !strings.HasSuffix(lines[11], "  ml/train") {
		t.Errorf("get devices:\n%s\nwant dev-0 ... dev-10 in natural order, held by ml/train", out)
	}

	for _, tc := range []struct {
		args []string
		exit int
		want string // the output (the table after its header) or the error
	}{
		{[]string{"pods", "train"}, 0, `^ml +train +app .*\n$`},
		{[]string{"pods", "shop/web", "train"}, 0, `^ml +train +app .*\nshop +web +nginx .*\n$`},
		{[]string{"pods", "-n", "shop"}, 0, `^shop +web +nginx .*\n$`},
		{[]string{"pods", "nope", "web"}, 1, `^pod "nope" not found$`},
		{[]string{"pods", "-n", "ml", "web"}, 1, `^pod "web" not found$`},
		{[]string{"resources", "example.com/foo"}, 0, `^example\.com/foo +11 +11 +11 +true\n$`},
		{[]string{"devices", "example.com/bar", "example.com/baz"}, 1, `^resource "example\.com/bar", "example\.com/baz" not found$`},
		{[]string{"plugins", "example.com/foo"}, 0, ` example\.com/foo .* registered\n$`},
		{[]string{"plugins", "example.com/nope"}, 1, `^plugin "example\.com/nope" not found$`},
	} {
		out, err := run(t, append(tc.args, "--root", root)...)
		if code := cli.ExitCode(err); code != tc.exit {
			t.Errorf("get %v: exit %d (%v), want %d", tc.args, code, err, tc.exit)
			continue
		}
		got := out
		if _, body, ok := strings.Cut(out, "\n"); ok && err == nil {
			got = body
		}
		if err != nil {
			got = err.Error()
		}
		if !regexp.MustCompile(tc.want).MatchString(got) {
			t.Errorf("get %v:\n%s\ndoes not match %s", tc.args, got, tc.want)
		}
	}

	// The root without --root: $DPKIT_ROOT, else the recorded one while
	// it serves, else the default; --root wins over both.
	state := t.TempDir()
	vars := map[string]string{"XDG_STATE_HOME": state}
	getenv := func(k string) string { return vars[k] }
	if err := emulator.RecordRoot(root, getenv); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		vars map[string]string
		args []string
		ok   bool
		want string
	}{
		{"recorded", vars, nil, true, ""},
		{"environment", map[string]string{emulator.RootEnv: root}, nil, true, ""},
		{"flag over environment", map[string]string{emulator.RootEnv: "/nowhere"}, []string{"--root", root}, true, ""},
		{"environment over recorded", map[string]string{emulator.RootEnv: "/nowhere", "XDG_STATE_HOME": state}, nil, false, "(root /nowhere, from $DPKIT_ROOT; --root chooses another)"},
		{"nothing", nil, nil, false, "(root /var/lib/kubelet, from the default; --root chooses another)"},
	} {
		out, _, err := runEnv(t, tc.vars, append([]string{"resources"}, tc.args...)...)
		if tc.ok != (err == nil) || tc.ok && !strings.Contains(out, "example.com/foo  11") || !tc.ok && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: get resources: %v\n%s\nwant ok=%t %s", tc.name, err, out, tc.ok, tc.want)
		}
	}
	dead := t.TempDir()
	if err := emulator.RecordRoot(dead, getenv); err != nil {
		t.Fatal(err)
	}
	if r := emulator.ChooseRoot("", false, getenv); r.Dir != emulator.DefaultRoot || r.From != emulator.FromDefault {
		t.Errorf("ChooseRoot with a recorded root nothing serves = %+v, want the default", r)
	}

	// Shell completion: kinds, the emulator's pod and resource names, and
	// the output formats.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"get", ""}, []string{"resources", "devices", "plugins", "pods", "claims", "slices"}},
		{[]string{"get", "pods", "--root", root, ""}, []string{"train", "web"}},
		{[]string{"get", "devices", "--root", root, ""}, []string{"example.com/foo"}},
		{[]string{"get", "pods", "-o", ""}, []string{"table", "json", "yaml"}},
	} {
		if got := complete(t, tc.args...); !slices.Equal(got, tc.want) {
			t.Errorf("completing %q: %q, want %q", tc.args, got, tc.want)
		}
	}
}

// complete runs cobra's completion of args under a root command and
// returns the candidates.
func complete(t *testing.T, args ...string) []string {
	t.Helper()
	var out bytes.Buffer
	parent := &cobra.Command{Use: "dpkit"}
	parent.AddCommand(NewCommand(&cli.Env{Out: io.Discard, Err: io.Discard, Logger: slog.New(slog.DiscardHandler), Getenv: func(string) string { return "" }}))
	parent.SetArgs(append([]string{cobra.ShellCompRequestCmd}, args...))
	parent.SetOut(&out)
	parent.SetErr(io.Discard)
	if err := parent.Execute(); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(out.String(), "\n") {
		if l != "" && !strings.HasPrefix(l, ":") && !strings.HasPrefix(l, "Completion ended") {
			got = append(got, strings.SplitN(l, "\t", 2)[0])
		}
	}
	return got
}
