package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilexec "k8s.io/client-go/util/exec"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/cri"
	"github.com/dpkit/dpkit/test/controlplane"
)

// criRuntime is a containerd of the test's own: the real node's binaries
// (hack/build-node.sh), runc, the ptp and portmap (hostPort) CNI plugins,
// its own root, state, socket and pod subnet, and no kubelet beside it (a
// kubelet kills the sandboxes it does not know).
type criRuntime struct {
	dir, socket string
	ctr         string
	rt          runtimeapi.RuntimeServiceClient
	// cgroupRoot is the nodes' --cgroup-root: every pod's cgroup is below
	// it, and the test removes what is left of it when it ends.
	cgroupRoot string
}

// use points the node's options at this runtime.
func (r *criRuntime) use(o *noderun.Options) {
	o.Backend, o.CRIEndpoint, o.CgroupRoot = "cri", "unix://"+r.socket, r.cgroupRoot
}

// containerdOption changes the test's containerd.
type containerdOption func(*containerdConfig)

type containerdConfig struct {
	dockerHubMirror string
}

// withDockerHubMirror has the runtime pull the images of docker.io
// ("foo" is docker.io/library/foo:latest) from the registry at addr
// (plain HTTP), and from nowhere else: containerd's hosts.toml for
// docker.io names that mirror and no upstream server.
func withDockerHubMirror(addr string) containerdOption {
	return func(c *containerdConfig) { c.dockerHubMirror = addr }
}

// startContainerd starts containerd with the pause and busybox images the
// real node uses, and stops it (every sandbox removed first) when the test
// ends.
func startContainerd(t *testing.T, ctx context.Context, opts ...containerdOption) *criRuntime {
	t.Helper()
	var cfg containerdConfig
	for _, o := range opts {
		o(&cfg)
	}
	if testing.Short() {
		t.Skip(controlplane.NodeSkipMessage)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("the cri backend's test runs containerd and runc, which need root (running as uid %d)", os.Geteuid())
	}
	bins := os.Getenv(controlplane.EnvNodeBinDir)
	if bins == "" {
		bins = filepath.Clean(controlplane.DefaultNodeBinDir())
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "pause"} {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			t.Fatalf("%v: run bash %s (or set $%s)", err, controlplane.NodeBuildScript, controlplane.EnvNodeBinDir)
		}
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("runc: %v: install the runc package", err)
	}
	for _, p := range []string{"ptp", "portmap"} {
		if _, err := os.Stat("/usr/lib/cni/" + p); err != nil {
			t.Fatalf("%v: install containernetworking-plugins", err)
		}
	}
	dir, err := os.MkdirTemp("", "dpkit-cri")
	if err != nil {
		t.Fatal(err)
	}
	r := &criRuntime{dir: dir, socket: filepath.Join(dir, "containerd.sock"), ctr: filepath.Join(bins, "ctr"), cgroupRoot: "/" + filepath.Base(dir)}
	for _, d := range []string{"cni", "cdi", "certs.d"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.dockerHubMirror != "" {
		if err := os.MkdirAll(filepath.Join(dir, "certs.d", "docker.io"), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, "certs.d", "docker.io", "hosts.toml"), `[host."http://`+cfg.dockerHubMirror+`"]
  capabilities = ["pull", "resolve"]
`)
	}
	// ptp turns IPv4 forwarding on: put back what the host had.
	const forward = "/proc/sys/net/ipv4/ip_forward"
	if old, err := os.ReadFile(forward); err == nil {
		t.Cleanup(func() { _ = os.WriteFile(forward, old, 0o644) })
	}
	subnet := fmt.Sprintf("10.250.%d.0/24", rand.IntN(250)) //nolint:gosec // not a secret
	writeFile(t, filepath.Join(dir, "cni", "10-dpkit-cri.conflist"), `{
  "cniVersion": "1.0.0", "name": "dpkit-cri-test",
  "plugins": [{"type": "ptp", "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "`+subnet+`"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "`+filepath.Join(dir, "ipam")+`"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}]
}
`)
	conf := filepath.Join(dir, "containerd.toml")
	writeFile(t, conf, `version = 3
root = "`+filepath.Join(dir, "root")+`"
state = "`+filepath.Join(dir, "state")+`"
[grpc]
  address = "`+r.socket+`"
[plugins.'io.containerd.internal.v1.opt']
  path = "`+filepath.Join(dir, "opt")+`"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '`+controlplane.PauseImage+`'
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '`+filepath.Join(dir, "certs.d")+`'
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  cdi_spec_dirs = ['`+filepath.Join(dir, "cdi")+`']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = '`+runc+`'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '`+filepath.Join(dir, "cni")+`'
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`)
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bins, "containerd"), "--config", conf)
	cmd.Env = []string{"PATH=" + bins + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	conn, err := grpc.NewClient("unix://"+r.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.rt = runtimeapi.NewRuntimeServiceClient(conn)
	t.Cleanup(func() {
		r.removeAll(t)
		conn.Close()
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		// A shim outlives its containerd by design; with every sandbox
		// removed none should be left, and any that is names a pod the
		// runtime could not stop.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		killed, err := controlplane.EndProcesses(ctx, controlplane.WithArg(r.socket))
		if err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, k := range killed {
			t.Logf("cleanup: killed %s, left by the test's containerd", k)
		}
		// The pods' cgroups the runtime and the node did not remove
		// (a pod the test left to removeAll keeps its pod<UID>).
		if mounts, err := procfs.CgroupMounts(); err == nil {
			for _, m := range mounts {
				if err := procfs.RemoveTree(filepath.Join(m, r.cgroupRoot)); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("containerd log (last 4 KiB):\n%s", tail(b, 4096))
			}
		}
		_ = syscall.Unmount(filepath.Join(dir, "root"), syscall.MNT_DETACH)
		_ = os.RemoveAll(dir)
	})
	vctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := r.rt.Version(vctx, &runtimeapi.VersionRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("containerd did not answer on %s: %v", r.socket, err)
	}
	r.importImages(t, ctx, bins)
	return r
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// importImages packs and imports the sandbox image and busybox the real
// node imports (controlplane.BaseImages).
func (r *criRuntime) importImages(t *testing.T, ctx context.Context, bins string) {
	t.Helper()
	images, err := controlplane.BaseImages(ctx, filepath.Join(bins, "pause"))
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range images {
		archive := filepath.Join(r.dir, strings.ReplaceAll(filepath.Base(img.Name), ":", "_")+".oci.tar")
		if _, err := ociimage.WriteFile(archive, img); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, r.ctr, "--address", r.socket, "--namespace", "k8s.io", "images", "import", "--snapshotter", "overlayfs", archive)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ctr images import %s: %v\n%s", archive, err, out)
		}
	}
}

// removeAll stops and removes every sandbox, as crictl rmp -fa, and
// fails the test when one is left.
func (r *criRuntime) removeAll(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := controlplane.RemoveAllPods(ctx, r.socket); err != nil {
		t.Errorf("cleanup: %v", err)
	}
}

// podCgroups lists the pod's cgroup directories below the runtime's
// cgroup root, in every hierarchy.
func (r *criRuntime) podCgroups(t *testing.T, uid types.UID) []string {
	t.Helper()
	mounts, err := procfs.CgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range mounts {
		d := filepath.Join(m, r.cgroupRoot, "pod"+string(uid))
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// podObjects lists, through the CRI API (what crictl pods and crictl ps -a
// read), the sandboxes and containers of the pod with uid.
func (r *criRuntime) podObjects(ctx context.Context, uid string) (sandboxes, containers []string, err error) {
	sbs, err := r.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, nil, err
	}
	for _, sb := range sbs.Items {
		if sb.Metadata.GetUid() == uid {
			sandboxes = append(sandboxes, sb.Id+" "+sb.State.String())
		}
	}
	cs, err := r.rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, nil, err
	}
	for _, c := range cs.Containers {
		if c.Labels[cri.LabelPodUID] == uid {
			containers = append(containers, c.Id+" "+c.State.String())
		}
	}
	return sandboxes, containers, nil
}

// TestVirtualNodeCRI: `dpkit node --backend cri` on a containerd of its
// own, the generic plugin serving /dev/zero as /dev/dpkit-zero; a pod
// asking for it runs as a container that sees the device node and the
// plugin's variable, its logs come through the API server, and deleting
// it leaves no sandbox or container in the runtime. A pod whose image
// cannot be pulled waits with the kubelet's reasons.
func TestVirtualNodeCRI(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri")
	const zero = corev1.ResourceName("example.com/zero")

	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	_, stopNode := runNode(t, ctx, o)

	cfg := filepath.Join(root, "plugin.yaml")
	writeFile(t, cfg, "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- generic:\n"+indent(zeroConfig(string(zero)), "    "))
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var out, logs bytes.Buffer
		done <- app.Run(pctx, []string{"plugin", "--config", cfg, "--plugin-dir", filepath.Join(root, "device-plugins")}, strings.NewReader(""), &out, &logs)
	}()
	t.Cleanup(func() { cancel(); <-done })
	poll(t, ctx, "2 "+string(zero)+" allocatable on "+name, func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		a := n.Status.Allocatable[zero]
		return a.Value() == 2, fmt.Sprintf("allocatable %v", n.Status.Allocatable), nil
	})

	ns := createNamespace(t, c, "vncri")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "zero", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": name},
			Tolerations:                   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			TerminationGracePeriodSeconds: ptr(int64(10)),
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", `ls -l /dev/dpkit-zero; echo "env=$DPKIT_E2E"; echo "cdi=${DPKIT_CDI_DEVICES-unset}"; trap "exit 0" TERM; sleep 3600 & wait`},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{zero: resource.MustParse("1")}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPod(t, ctx, c, ns, "zero", "Running on "+name, func(p *corev1.Pod) bool {
		return p.Spec.NodeName == name && p.Status.Phase == corev1.PodRunning
	})
	st := running.Status
	if len(st.ContainerStatuses) != 1 || !strings.HasPrefix(st.ContainerStatuses[0].ContainerID, "containerd://") || st.ContainerStatuses[0].ImageID == "" {
		t.Errorf("container status %+v, want a containerd:// container ID and an image ID", st.ContainerStatuses)
	}
	if !strings.HasPrefix(st.PodIP, "10.250.") {
		t.Errorf("pod IP %q, want one from the runtime's CNI subnet 10.250.x.0/24", st.PodIP)
	}

	var logs string
	poll(t, ctx, "the container's ls -l /dev/dpkit-zero through the API server", func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs("zero", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, "env="), logs, nil
	})
	// /dev/zero is character device 1,5: the container has it at the
	// plugin's container path.
	if !regexp.MustCompile(`(?m)^c\S+\s+\d+\s+\S+\s+\S+\s+1,\s+5 .*/dev/dpkit-zero$`).MatchString(logs) {
		t.Errorf("logs %q: no character device 1,5 at /dev/dpkit-zero", logs)
	}
	if !strings.Contains(logs, "env=from the plugin\n") || !strings.Contains(logs, "cdi=unset\n") {
		t.Errorf("logs %q: want the plugin's DPKIT_E2E and no DPKIT_CDI_DEVICES", logs)
	}
	sandboxes, containers, err := rtm.podObjects(ctx, string(running.UID))
	if err != nil {
		t.Fatal(err)
	}
	if len(sandboxes) != 1 || len(containers) != 1 {
		t.Fatalf("runtime has sandboxes %v and containers %v for the pod, want one of each", sandboxes, containers)
	}
	t.Logf("runtime: sandbox %v, container %v", sandboxes, containers)
	// The pod's cgroup is pod<UID> below the node's --cgroup-root.
	if cgs := rtm.podCgroups(t, running.UID); len(cgs) == 0 {
		t.Errorf("no cgroup %s/pod%s in any hierarchy, want the pod's sandbox below the node's --cgroup-root", rtm.cgroupRoot, running.UID)
	}

	// Exec through the API server runs in the container: it sees the
	// device, stdin reaches it, its exit code comes back.
	for _, mode := range []string{"websocket", "spdy"} {
		out, errOut, err := execInPod(ctx, cp.RESTConfig, mode, ns, "zero", []string{"sh", "-c", "head -c 3 /dev/dpkit-zero | od -An -tx1; hostname"}, "")
		if err != nil || !strings.Contains(out, "00 00 00") || !strings.Contains(out, "zero\n") {
			t.Errorf("%s: exec reading /dev/dpkit-zero: %q %q %v, want three zero bytes and the pod's hostname", mode, out, errOut, err)
		}
		out, _, err = execInPod(ctx, cp.RESTConfig, mode, ns, "zero", []string{"cat"}, "through stdin\n")
		if err != nil || out != "through stdin\n" {
			t.Errorf("%s: exec cat with stdin: %q, %v; want the input back", mode, out, err)
		}
		out, errOut, err = execInPod(ctx, cp.RESTConfig, mode, ns, "zero", []string{"sh", "-c", "echo out; echo oops >&2; exit 3"}, "")
		var ee utilexec.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() != 3 || out != "out\n" || errOut != "oops\n" {
			t.Errorf("%s: exec exiting 3: %q %q %v, want out, oops and exit code 3", mode, out, errOut, err)
		}
	}

	// dpkit node restarts: the container keeps running and the new node
	// adopts it.
	stopNode()
	// Mark the container waiting while no node runs, so that only the
	// restarted node's report makes it running again (its report may
	// otherwise equal the last one and change nothing).
	stale, err := c.CoreV1().Pods(ns).Get(ctx, "zero", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stale.Status.ContainerStatuses[0].State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "NodeRestarting"}}
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	runNode(t, ctx, o)
	adopted := waitPod(t, ctx, c, ns, "zero", "Running, reported by the restarted node", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return p.Status.Phase == corev1.PodRunning && len(cs) == 1 && cs[0].State.Running != nil
	})
	if before, after := running.Status.ContainerStatuses[0], adopted.Status.ContainerStatuses[0]; after.ContainerID != before.ContainerID || after.RestartCount != 0 {
		t.Errorf("after the restart: container %s restarts %d, want the same container %s, never restarted", after.ContainerID, after.RestartCount, before.ContainerID)
	}
	if sandboxes, containers, err := rtm.podObjects(ctx, string(running.UID)); err != nil || len(sandboxes) != 1 || len(containers) != 1 {
		t.Errorf("after the restart the runtime has sandboxes %v and containers %v (%v), want the same one of each", sandboxes, containers, err)
	}

	// Deleted: its container gets SIGTERM, exits 0, and the runtime keeps
	// nothing of it.
	if err := c.CoreV1().Pods(ns).Delete(ctx, "zero", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the pod gone from the API server", func(ctx context.Context) (bool, string, error) {
		_, err := c.CoreV1().Pods(ns).Get(ctx, "zero", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	poll(t, ctx, "no sandbox or container of the pod in the runtime", func(ctx context.Context) (bool, string, error) {
		sandboxes, containers, err := rtm.podObjects(ctx, string(running.UID))
		return err == nil && len(sandboxes) == 0 && len(containers) == 0, fmt.Sprintf("sandboxes %v containers %v err %v", sandboxes, containers, err), nil
	})
	if cgs := rtm.podCgroups(t, running.UID); len(cgs) != 0 {
		t.Errorf("the deleted pod's cgroups %v are still there, want them removed with its sandbox", cgs)
	}

	// An image that is not there with pull policy Never, and one that
	// cannot be pulled: the kubelet's waiting reasons.
	for _, tc := range []struct {
		name, image string
		policy      corev1.PullPolicy
		reasons     []string
	}{
		{"never", "dpkit.test/absent:1", corev1.PullNever, []string{"ErrImageNeverPull"}},
		{"pull", "dpkit.test/absent:1", corev1.PullIfNotPresent, []string{"ErrImagePull", "ImagePullBackOff"}},
	} {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{"kubernetes.io/hostname": name},
				Tolerations:  []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				Containers:   []corev1.Container{{Name: "app", Image: tc.image, ImagePullPolicy: tc.policy, Command: []string{"true"}}},
			},
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		got := waitPod(t, ctx, c, ns, tc.name, "waiting with "+strings.Join(tc.reasons, " or "), func(p *corev1.Pod) bool {
			for _, cs := range p.Status.ContainerStatuses {
				for _, r := range tc.reasons {
					if cs.State.Waiting != nil && cs.State.Waiting.Reason == r {
						return true
					}
				}
			}
			return false
		})
		t.Logf("%s: %s: %s", tc.name, got.Status.ContainerStatuses[0].State.Waiting.Reason, got.Status.ContainerStatuses[0].State.Waiting.Message)
		if got.Status.Phase != corev1.PodPending {
			t.Errorf("pod %s: phase %s, want Pending", tc.name, got.Status.Phase)
		}
	}
}

// TestVirtualNodeCRIDRA: with the cri backend, the CDI devices of a pod's
// ResourceClaim reach the runtime as CDI devices, which containerd
// resolves from its CDI specs: the container has the device node and the
// variable of the device the scheduler allocated, and no
// DPKIT_CDI_DEVICES.
func TestVirtualNodeCRIDRA(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-dra")
	// The CDI spec a real driver would write: each device /dev/zero at
	// /dev/dra-<device>, and a variable naming it.
	var devs []string
	for _, d := range []string{"gpu0", "gpu1"} {
		devs = append(devs, `{"name": "`+d+`", "containerEdits": {"env": ["DRA_`+d+`=yes"], "deviceNodes": [{"path": "/dev/dra-`+d+`", "hostPath": "/dev/zero"}]}}`)
	}
	writeFile(t, filepath.Join(rtm.dir, "cdi", "fake-dra.json"), `{"cdiVersion": "0.6.0", "kind": "`+dratest.DriverName+`/device", "devices": [`+strings.Join(devs, ", ")+`]}`)

	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	runNode(t, ctx, o)
	startDRADriver(t, ctx, c, cp.Kubeconfig, name, root, "gpu0", "gpu1")
	class := deviceClass(t, ctx, c, "")
	ns := createNamespace(t, c, "vncri-dra")
	if _, err := c.ResourceV1().ResourceClaims(ns).Create(ctx, claimFor(ns, "one", class, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := claimPod(ns, "dra", name, "one", []string{"sh", "-c", `env | grep ^DRA_; ls -l /dev/dra-*; echo "cdi=${DPKIT_CDI_DEVICES-unset}"`})
	pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = controlplane.BusyboxImage, corev1.PullNever
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "dra", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	claim, err := c.ResourceV1().ResourceClaims(ns).Get(ctx, "one", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim allocation %+v, want one device", claim.Status.Allocation)
	}
	dev := claim.Status.Allocation.Devices.Results[0].Device
	b, err := c.CoreV1().Pods(ns).GetLogs("dra", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logs := string(b)
	t.Logf("allocated %s; logs:\n%s", dev, logs)
	if !strings.Contains(logs, "DRA_"+dev+"=yes\n") || strings.Count(logs, "DRA_") != 1 {
		t.Errorf("logs %q: want the variable of %s only", logs, dev)
	}
	if !regexp.MustCompile(`(?m)^c\S+\s+\d+\s+\S+\s+\S+\s+1,\s+5 .*/dev/dra-`+dev+`$`).MatchString(logs) || strings.Count(logs, "/dev/dra-") != 1 {
		t.Errorf("logs %q: want character device 1,5 at /dev/dra-%s only", logs, dev)
	}
	if !strings.Contains(logs, "cdi=unset\n") {
		t.Errorf("logs %q: DPKIT_CDI_DEVICES is set", logs)
	}
}

// TestVirtualNodeCRIFakeAllocate: with the cri backend, everything the
// fake plugin's Allocate answers reaches the container: its variables, a
// read-only bind mount, and a CDI device that containerd resolves from the
// runtime's CDI specs.
func TestVirtualNodeCRIFakeAllocate(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	name := unique("vncri-fake")
	const res = corev1.ResourceName("example.com/fakecri")
	share := filepath.Join(root, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(share, "hello"), "from the host\n")
	writeFile(t, filepath.Join(rtm.dir, "cdi", "fake-cri.json"), `{"cdiVersion": "0.6.0", "kind": "fake.dpkit.io/dev", "devices": [`+
		`{"name": "dev-0", "containerEdits": {"env": ["FAKE_CDI=dev-0"], "deviceNodes": [{"path": "/dev/fake-cdi", "hostPath": "/dev/zero"}]}},`+
		`{"name": "dev-1", "containerEdits": {"env": ["FAKE_CDI=dev-1"], "deviceNodes": [{"path": "/dev/fake-cdi", "hostPath": "/dev/zero"}]}}]}`)

	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	rtm.use(&o)
	runNode(t, ctx, o)
	cfg := filepath.Join(root, "plugin.yaml")
	writeFile(t, cfg, `apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resources:
    - name: `+string(res)+`
      count: 2
      allocate:
        envs: {FAKE_ENV: "got {ids}"}
        mounts:
        - {containerPath: /mnt/fake, hostPath: `+share+`, readOnly: true}
        cdiDevices: ["fake.dpkit.io/dev={id}"]
`)
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var out, logs bytes.Buffer
		done <- app.Run(pctx, []string{"plugin", "--config", cfg, "--plugin-dir", filepath.Join(root, "device-plugins")}, strings.NewReader(""), &out, &logs)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitAllocatable(t, ctx, c, name, res, "2")

	ns := createNamespace(t, c, "vncri-fake")
	pod := devicePod(ns, "fake", name, "0", []string{"sh", "-c", `echo "env=$FAKE_ENV"; echo "cdi=$FAKE_CDI"; cat /mnt/fake/hello; ls -l /dev/fake-cdi; touch /mnt/fake/x 2>/dev/null || echo "mount read-only"`})
	pod.Spec.Containers[0].Image, pod.Spec.Containers[0].ImagePullPolicy = controlplane.BusyboxImage, corev1.PullNever
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPod(t, ctx, c, ns, "fake", "Succeeded", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodSucceeded })
	b, err := c.CoreV1().Pods(ns).GetLogs("fake", &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	logs := string(b)
	t.Logf("container log:\n%s", logs)
	id := regexp.MustCompile(`env=got (dev-[01])\n`).FindStringSubmatch(logs)
	if id == nil {
		t.Fatalf("log %q: no FAKE_ENV from Allocate", logs)
	}
	for _, want := range []string{"cdi=" + id[1] + "\n", "from the host\n", "mount read-only\n"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log %q: want %q", logs, want)
		}
	}
	if !regexp.MustCompile(`(?m)^c\S+\s+\d+\s+\S+\s+\S+\s+1,\s+5 .*/dev/fake-cdi$`).MatchString(logs) {
		t.Errorf("log %q: no character device 1,5 at /dev/fake-cdi from the CDI device", logs)
	}
}
