package noderun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestParseTaints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      []string
		want    []corev1.Taint
		wantErr string
	}{
		{"default", []string{"dpkit.io/virtual-node:NoSchedule"}, []corev1.Taint{{Key: "dpkit.io/virtual-node", Effect: corev1.TaintEffectNoSchedule}}, ""},
		{"value", []string{"a=b:NoExecute"}, []corev1.Taint{{Key: "a", Value: "b", Effect: corev1.TaintEffectNoExecute}}, ""},
		{"none", []string{""}, []corev1.Taint{}, ""},
		{"no effect", []string{"a"}, nil, "want key[=value]:Effect"},
		{"bad effect", []string{"a:Sometimes"}, nil, "effect must be"},
		{"empty key", []string{"=v:NoSchedule"}, nil, "empty key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseTaints(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(got) != len(tc.want) {
				t.Fatalf("ParseTaints = %v, %v; want %v", got, err, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("ParseTaints = %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	o := Options{Backend: "docker", Count: 0, CPU: "x", Memory: "1Gi", Pods: "10", Resources: []string{"example.com/a"}, Taints: []string{"bad"}, DeviceGracePeriod: -time.Second, DeviceAdmissionWait: -time.Second, PodSyncWorkers: -1, PluginRegistration: "grpc"}
	err := o.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"13 problem(s):\n  - --name: Required value", "\n  - --root", "\n  - --backend", "\n  - --device-admission-wait", "\n  - --device-grace-period", "\n  - --count", "\n  - --pod-sync-workers",
		"\n  - --plugin-registration: Unsupported value: \"grpc\": supported values: \"socket\", \"in-process\"", "\n  - --qps", "\n  - --burst",
		"\n  - --cpu: Invalid value: \"x\": not a quantity", "\n  - --resource[0]: Invalid value: \"example.com/a\": must be NAME=QUANTITY",
		"\n  - --taint[0]: Invalid value: \"bad\": want key[=value]:Effect"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// TestDefaultPodSyncWorkers: one node keeps virtual-kubelet's 10 workers
// per queue; many nodes' shared queues have 2 a node (1 with the sim
// backend), up to 64 (32).
func TestDefaultPodSyncWorkers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		count   int
		backend string
		want    int
	}{
		{1, "sim", 10}, {1, "process", 10}, {1, "cri", 10},
		{3, "process", 6}, {3, "sim", 3},
		{1000, "process", 64}, {1000, "cri", 64}, {1000, "sim", 32},
	} {
		if got := DefaultPodSyncWorkers(tc.count, tc.backend); got != tc.want {
			t.Errorf("%d nodes, %s backend: %d workers a queue, want %d", tc.count, tc.backend, got, tc.want)
		}
	}
}

// TestDefaultPluginRegistration: one node's plugins register through
// sockets, as on a kubelet; each of many nodes' in process.
func TestDefaultPluginRegistration(t *testing.T) {
	t.Parallel()
	if got := DefaultPluginRegistration(1); got != RegistrationSocket {
		t.Errorf("one node: %s, want %s", got, RegistrationSocket)
	}
	if got := DefaultPluginRegistration(2); got != RegistrationInProcess {
		t.Errorf("two nodes: %s, want %s", got, RegistrationInProcess)
	}
}

// TestValidateCRIEndpoint: --cri-endpoint and --cgroup-root go with
// --backend cri, which needs an endpoint; only unix sockets are accepted,
// and a cgroup root is a clean absolute path.
func TestValidateCRIEndpoint(t *testing.T) {
	t.Parallel()
	const sock = "unix:///run/containerd/containerd.sock"
	for _, tc := range []struct {
		name, backend, endpoint, want string
		cgroupRoot                    string
	}{
		{name: "cgroup root", backend: "cri", endpoint: sock, cgroupRoot: "/dpkit"},
		{name: "relative cgroup root", backend: "cri", endpoint: sock, cgroupRoot: "dpkit", want: "--cgroup-root: Invalid value: \"dpkit\": want a clean absolute cgroupfs path"},
		{name: "cgroup root climbing up", backend: "cri", endpoint: sock, cgroupRoot: "/dpkit/../x", want: "--cgroup-root: Invalid value: \"/dpkit/../x\": want a clean"},
		{name: "cgroup root at the root", backend: "cri", endpoint: sock, cgroupRoot: "/", want: "--cgroup-root: Invalid value: \"/\""},
		{name: "cgroup root without cri", backend: "process", cgroupRoot: "/dpkit", want: "--cgroup-root: Invalid value: \"/dpkit\": only the cri backend puts pods in cgroups"},
		{name: "cri without endpoint", backend: "cri", endpoint: "", want: "--cri-endpoint: Required value: the cri backend needs the container runtime's socket"},
		{name: "endpoint without cri", backend: "process", endpoint: "unix:///run/containerd/containerd.sock", want: "--cri-endpoint: Invalid value: \"unix:///run/containerd/containerd.sock\": only the cri backend uses a container runtime: add --backend cri"},
		{name: "tcp endpoint", backend: "cri", endpoint: "tcp://127.0.0.1:1234", want: "--cri-endpoint: Invalid value: \"tcp://127.0.0.1:1234\": only unix sockets are supported"},
		{name: "unix endpoint", backend: "cri", endpoint: "unix:///run/containerd/containerd.sock", want: ""},
		{name: "plain path", backend: "cri", endpoint: "/run/containerd/containerd.sock", want: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := Options{Name: "n", Root: "/r", Backend: tc.backend, CRIEndpoint: tc.endpoint, CgroupRoot: tc.cgroupRoot, Count: 1, QPS: 1, Burst: 1, CPU: "1", Memory: "1Gi", Pods: "10"}
			err := o.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one with %q", err, tc.want)
			}
		})
	}
}

func FuzzParseTaints(f *testing.F) {
	f.Add("a=b:NoSchedule")
	f.Add(":")
	f.Add("k:NoExecute")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTaints([]string{s})
		if err == nil {
			for _, tt := range got {
				if tt.Key == "" || tt.Effect == "" {
					t.Fatalf("accepted %q as %+v", s, tt)
				}
			}
		}
	})
}

// TestValidatePluginConfig: --plugin-config is read and checked with the
// options, and what an in-process plugin cannot do is named with the fix.
func TestValidatePluginConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\n"
	fake := "plugins:\n- fake:\n    resources:\n    - name: example.com/dev\n      count: 8\n"
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"fake", base + fake, nil},
		{"metrics", base + "metricsAddress: :9400\n" + fake, []string{"metricsAddress: Invalid value: \":9400\": the in-process plugins of dpkit node serve no metrics of their own: remove it"}},
		{"dirs", base + "pluginDir: /var/lib/kubelet/device-plugins\nregistryDir: /r\n" + fake, []string{"pluginDir: Invalid value: \"/var/lib/kubelet/device-plugins\": dpkit node serves each in-process plugin for its own node, in the node's root", "registryDir: Invalid value"}},
		{"dra", base + "plugins:\n- fronts: [deviceplugin, dra]\n  fake:\n    resources:\n    - name: example.com/dev\n      count: 8\n", nil},
		{"dra-node", base + "dra: {nodeName: gpu-1, kubeconfig: /k, pluginsDir: /p, podResourcesSocket: /s}\nplugins:\n- fronts: [dra]\n  fake:\n    resources:\n    - name: example.com/dev\n      count: 8\n",
			[]string{"dra.nodeName: Invalid value: \"gpu-1\"", "dra.kubeconfig: Invalid value", "dra.pluginsDir: Invalid value", "dra.podResourcesSocket: Invalid value", "with the node's API client: remove it"}},
		{"bad", base + "plugins:\n- fake:\n    resources:\n    - name: example.com/dev\n      count: -1\n", []string{"--plugin-config " + filepath.Join(dir, "bad.yaml"), "plugins[0].fake.resources[0].count"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Name: "n", Root: "/r", Backend: "sim", Count: 1, QPS: 1, Burst: 1, CPU: "1", Memory: "1Gi", Pods: "10", PluginConfig: write(tc.name+".yaml", tc.body)}
			err := o.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	o := Options{Name: "n", Root: "/r", Backend: "sim", Count: 1, QPS: 1, Burst: 1, CPU: "1", Memory: "1Gi", Pods: "10", PluginConfig: filepath.Join(dir, "missing.yaml")}
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--plugin-config") {
		t.Errorf("missing file: %v", err)
	}
}

// TestCheckInotify: more nodes than the inotify watches left are refused
// with the limit, what is in use and the sysctl that raises it.
func TestCheckInotify(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	limit := filepath.Join(dir, "max_user_watches")
	if err := os.WriteFile(limit, []byte("8192\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Two processes: an inotify instance with 3 watches and one with 1,
	// and other files, whose fdinfo does not count.
	proc := filepath.Join(dir, "proc")
	for i, fd := range []struct{ target, info string }{
		{"anon_inode:inotify", "pos:\t0\nflags:\t02004000\ninotify wd:3 ino:1 sdev:2 mask:fc6 ignored_mask:0\ninotify wd:2 ino:3 sdev:2 mask:fc6 ignored_mask:0\ninotify wd:1 ino:4 sdev:2 mask:fc6 ignored_mask:0\n"},
		{"anon_inode:inotify", "inotify wd:1 ino:5 sdev:2 mask:fc6 ignored_mask:0\n"},
		{"/dev/null", "inotify wd:1 not an inotify instance\n"},
		{"socket:[1]", ""},
	} {
		pid := filepath.Join(proc, strconv.Itoa(100+i%2))
		for _, sub := range []string{"fd", "fdinfo"} {
			if err := os.MkdirAll(filepath.Join(pid, sub), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(fd.target, filepath.Join(pid, "fd", strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pid, "fdinfo", strconv.Itoa(i)), []byte(fd.info), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkInotify(Options{Count: 8188}, limit, proc, nil); err != nil {
		t.Errorf("8188 nodes + 4 in use of 8192: %v", err)
	}
	err := checkInotify(Options{Count: 10000, PluginConfig: "f.yaml"}, limit, proc, nil)
	want := "--count 10000 needs 10000 inotify watches (1 per node: its plugin directory), and fs.inotify.max_user_watches is 8192 with 4 in use: raise it, e.g. sysctl -w fs.inotify.max_user_watches=11028, or pass --inotify-limit raise, or run fewer nodes per process"
	if err == nil || err.Error() != want {
		t.Errorf("error %v\nwant  %s", err, want)
	}
	if err := checkInotify(Options{Count: 100000}, filepath.Join(dir, "missing"), proc, nil); err != nil {
		t.Errorf("no limit to read: %v", err)
	}
	// raise writes what the nodes need, what is in use and headroom.
	if err := checkInotify(Options{Count: 10000, PluginConfig: "f.yaml", InotifyLimit: InotifyRaise}, limit, proc, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("raise: %v", err)
	}
	if b, err := os.ReadFile(limit); err != nil || string(b) != "11028\n" {
		t.Errorf("raised limit %q (%v), want 11028", b, err)
	}
	// A limit that cannot be written is named with the fix: a read-only
	// sysctl (65536), even for root, stands for it.
	err = checkInotify(Options{Count: 1000000, InotifyLimit: InotifyRaiseOnly}, "/proc/sys/kernel/ngroups_max", proc, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "--inotify-limit raise-only: --count 1000000 needs 1000000 inotify watches") || !strings.Contains(err.Error(), "privileged") {
		t.Errorf("unwritable limit: %v", err)
	}
}

// TestPortInUse runs "dpkit node" on a port another process serves: it
// fails before it registers, naming the address, why, and the flag that
// chooses another port; errors.Is still sees EADDRINUSE.
func TestPortInUse(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	port := busy.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	// Nothing serves this API server: the node fails before it calls it.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: t}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o := Options{Kubeconfig: kubeconfig, Name: "n", Root: filepath.Join(dir, "root"), Backend: "sim", Port: port, NodeIP: "127.0.0.1",
		Count: 1, QPS: 50, Burst: 100, CPU: "8", Memory: "32Gi", Pods: "110"}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = Run(ctx, nil, o, nil)
	addr := busy.Addr().String()
	want := "node API: listen tcp " + addr + ": bind: address already in use: another process serves that port (a kubelet, another dpkit node); pass --port with a free port, or --port -1 for no node API"
	if err == nil || err.Error() != want {
		t.Fatalf("dpkit node on a busy port: %v\nwant %s", err, want)
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("errors.Is(%v, EADDRINUSE) is false", err)
	}

	// With --count, the hint says which ports the nodes take.
	o.Count = 3
	want = "node i of --count 3 serves on --port+i: pass a --port with the 3 ports from it free, or --port -1 for no node API"
	if err := portHint(o, fmt.Errorf("node API: %w", err)); !strings.HasSuffix(err.Error(), want) || !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("with --count 3: %v, want it to end %q", err, want)
	}
	if err := portHint(o, context.Canceled); !errors.Is(err, context.Canceled) || err.Error() != context.Canceled.Error() {
		t.Errorf("another error changed: %v", err)
	}
}

// TestPluginConfigPerNode: each node's copy of --plugin-config serves in
// that node's root and publishes for that node; a dra.cdiDir is kept. The
// process backend reads <root>/cdi only when a DRA front writes there.
func TestPluginConfigPerNode(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "c.yaml")
	body := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- fronts: [dra]\n  fake:\n    resources:\n    - name: example.com/dev\n      count: 8\n"
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	o := Options{PluginConfig: p}
	perNode, nodeCDI, err := o.pluginConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := perNode("/r/gpu-1", "gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	if !nodeCDI {
		t.Error("a DRA front writing in the node's root: nodeCDI false")
	}
	for _, f := range []struct{ name, got, want string }{
		{"pluginDir", c.PluginDir, "/r/gpu-1/device-plugins"},
		{"registryDir", c.RegistryDir, "/r/gpu-1/plugins_registry"},
		{"dra.pluginsDir", c.DRA.PluginsDir, "/r/gpu-1/plugins"},
		{"dra.podResourcesSocket", c.DRA.PodResourcesSocket, "/r/gpu-1/pod-resources/kubelet.sock"},
		{"dra.cdiDir", c.DRA.CDIDir, "/r/gpu-1/cdi"},
		{"dra.nodeName", c.DRA.NodeName, "gpu-1"},
	} {
		if f.got != f.want {
			t.Errorf("%s = %q, want %q", f.name, f.got, f.want)
		}
	}
	if err := os.WriteFile(p, []byte(strings.Replace(body, "plugins:", "dra: {cdiDir: /var/run/cdi-node}\nplugins:", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if perNode, nodeCDI, err = o.pluginConfig(); err != nil {
		t.Fatal(err)
	}
	if c, err = perNode("/r/gpu-1", "gpu-1"); err != nil || c.DRA.CDIDir != "/var/run/cdi-node" {
		t.Errorf("with dra.cdiDir set: cdiDir %q, %v", c.DRA.CDIDir, err)
	}
	if nodeCDI {
		t.Error("with dra.cdiDir set: nodeCDI true")
	}
	if err := os.WriteFile(p, []byte(strings.Replace(body, "[dra]", "[deviceplugin]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, nodeCDI, err = o.pluginConfig(); err != nil || nodeCDI {
		t.Errorf("the device plugin front only: nodeCDI %v, %v", nodeCDI, err)
	}
}
