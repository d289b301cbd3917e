package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/internal/repopath"
)

// kernelTunables are the sysctls the kubelet sets when
// protectKernelDefaults is false (setupKernelTunables in
// pkg/kubelet/cm/container_manager_linux.go), plus the IPv4 forwarding the
// ptp CNI plugin turns on. StartNode saves them and Stop restores them.
var kernelTunables = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
}

// nodeBinaries are the files StartNode needs in NodeOptions.BinDir.
var nodeBinaries = []string{"kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "pause"}

// systemTools are what the node takes from the system, with the Debian
// package that has each.
var systemTools = []struct{ path, pkg string }{
	{"runc", "runc"},
	{"/usr/lib/cni/ptp", "containernetworking-plugins"},
	{"/usr/lib/cni/host-local", "containernetworking-plugins"},
	{"/usr/lib/cni/loopback", "containernetworking-plugins"},
	{BusyboxBinary, "busybox-static"},
	{"nsenter", "util-linux"},
}

type nodeImpl struct {
	cp     *ControlPlane
	logger *slog.Logger
	bins   map[string]string
	runc   string

	mountns    *process
	containerd *process
	kubelet    *process

	kubeletArgs []string
	healthzURL  string
	sysctls     map[string]string
	shareName   string
	// cgroupDirs are the node's cgroups in every hierarchy: CgroupRoot
	// (the kubelet's) and runtimeCgroup (containerd's and its shims').
	cgroupDirs []string

	mu      sync.Mutex
	stopped bool
	stopErr error
}

// StartNode starts a real node on cp and waits until its Node is Ready and
// schedulable. Only one node runs per control plane; cp.Stop stops it
// first. The node needs root, Linux, the binaries of hack/build-node.sh
// and runc, the reference CNI plugins and busybox-static from the system;
// the error says which is missing and how to get it. On error nothing it
// started is left running and every host setting it changed is restored.
//
// What it runs, in order:
//  1. a process holding a private mount namespace in which Dir/var-lib,
//     Dir/var-log and Dir/run are bound at /var/lib, /var/log and /run;
//  2. containerd 2.x in that namespace and in its own cgroup (CgroupRoot
//     with "-runtime" appended), where its shims run too (CRI with CDI
//     from /var/run/cdi, runc, the overlayfs snapshotter, the ptp CNI plugin giving each pod a
//     veth and an address in PodSubnet reachable from the host only),
//     with PauseImage and BusyboxImage imported;
//  3. the kubelet in that namespace, as system:node:127.0.0.1, serving
//     on 127.0.0.1 with x509 client authentication against
//     cp.ClientCAFile, its pods' cgroups under CgroupRoot.
func (cp *ControlPlane) StartNode(ctx context.Context, opts NodeOptions) (_ *Node, err error) {
	cp.mu.Lock()
	if cp.node != nil || cp.stopped {
		cp.mu.Unlock()
		return nil, errors.New("controlplane: StartNode: a node already runs on this control plane, or it is stopped")
	}
	cp.mu.Unlock()
	logger := opts.Logger
	if logger == nil {
		logger = cp.logger
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	n := &Node{Name: NodeName, Dir: filepath.Join(cp.Dir, "node")}
	im := &n.impl
	im.cp, im.logger = cp, logger
	if err := im.findBinaries(opts); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("controlplane: %w: the kubelet, containerd and runc need root (running as uid %d)", ErrNodeUnsupported, os.Geteuid())
	}
	n.KubeletRoot = n.path("/var/lib/kubelet")
	n.CDIDir = n.path("/var/run/cdi")
	n.ContainerdSocket = n.path("/run/containerd/containerd.sock")
	n.PodLogDir = n.path("/var/log/pods")
	n.CgroupRoot = "/dpkit-node-" + strings.TrimPrefix(filepath.Base(cp.Dir), "dpkit-cp-")
	defer func() {
		if err != nil {
			if stopErr := n.Stop(); stopErr != nil {
				err = errors.Join(err, stopErr)
			}
		}
	}()
	began := time.Now()
	for _, d := range []string{"etc/cni", "var-lib/kubelet/device-plugins", "var-log", "run/cdi"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("controlplane: node: %w", err)
		}
	}
	if err := n.joinHost(); err != nil {
		return nil, fmt.Errorf("controlplane: node: register in %s: %w", hostShareDir, err)
	}
	if err := n.makeCgroups(); err != nil {
		return nil, err
	}
	if err := n.startMountNamespace(ctx); err != nil {
		return nil, err
	}
	if err := n.startContainerd(ctx, false); err != nil {
		return nil, err
	}
	if err := n.importBaseImages(ctx); err != nil {
		return nil, err
	}
	logger.Info("Containerd ready", "socket", n.ContainerdSocket, "after", time.Since(began).Round(time.Millisecond))
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if err := n.waitSchedulable(ctx); err != nil {
		return nil, err
	}
	cp.mu.Lock()
	cp.node = n
	cp.mu.Unlock()
	logger.Info("Node ready", "name", n.Name, "dir", n.Dir, "after", time.Since(began).Round(time.Millisecond))
	return n, nil
}

// path returns the host path of a path on the node.
func (n *Node) path(p string) string {
	for _, m := range []struct{ on, dir string }{{"/var/run", "run"}, {"/var/lib", "var-lib"}, {"/var/log", "var-log"}, {"/run", "run"}} {
		if p == m.on || strings.HasPrefix(p, m.on+"/") {
			return filepath.Join(n.Dir, m.dir, strings.TrimPrefix(p, m.on))
		}
	}
	return p
}

// LogPath returns the log of a node component: "mountns", "containerd" or
// "kubelet".
func (n *Node) LogPath(component string) string {
	return filepath.Join(n.Dir, component+".log")
}

func (im *nodeImpl) findBinaries(opts NodeOptions) error {
	dir := opts.binDir()
	im.bins = map[string]string{}
	var missing []string
	for _, b := range nodeBinaries {
		p := filepath.Join(dir, b)
		if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			missing = append(missing, b)
			continue
		}
		im.bins[b] = p
	}
	var errs []error
	if len(missing) > 0 {
		cmd := "bash " + repopath.Find(NodeBuildScript)
		if dir != filepath.Clean(DefaultNodeBinDir()) {
			cmd = EnvNodeBinDir + "=" + dir + " " + cmd
		}
		errs = append(errs, fmt.Errorf("%w: %s not found in %s; build them with: %s", ErrBinariesMissing, strings.Join(missing, ", "), dir, cmd))
	}
	var pkgs []string
	for _, tool := range systemTools {
		p, err := exec.LookPath(tool.path)
		if err != nil {
			if !slices.Contains(pkgs, tool.pkg) {
				pkgs = append(pkgs, tool.pkg)
			}
			continue
		}
		if tool.path == "runc" {
			im.runc = p
		}
	}
	if len(pkgs) > 0 {
		errs = append(errs, fmt.Errorf("%w: runc, the CNI plugins ptp/host-local/loopback, busybox or nsenter are missing; install them with: apt-get install %s", ErrBinariesMissing, strings.Join(pkgs, " ")))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	return nil
}

func readSysctls() (map[string]string, error) {
	out := map[string]string{}
	for _, k := range kernelTunables {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			return nil, fmt.Errorf("controlplane: node: read sysctl %s: %w", k, err)
		}
		out[k] = strings.TrimSpace(string(b))
	}
	return out, nil
}

// restoreSysctls writes back every saved value that changed.
func (im *nodeImpl) restoreSysctls() error {
	var errs []error
	for _, k := range kernelTunables {
		want, ok := im.sysctls[k]
		if !ok {
			continue
		}
		b, err := os.ReadFile("/proc/sys/" + k)
		if err == nil && strings.TrimSpace(string(b)) == want {
			continue
		}
		if err := os.WriteFile("/proc/sys/"+k, []byte(want+"\n"), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", strings.ReplaceAll(k, "/", "."), want, err))
			continue
		}
		im.logger.Info("Restored sysctl", "name", strings.ReplaceAll(k, "/", "."), "value", want)
	}
	return errors.Join(errs...)
}

// runtimeCgroup is the cgroup containerd runs in, beside the kubelet's
// root as a real node's runtime has its own (systemd's
// system.slice/containerd.service). The shims containerd starts inherit
// it, so Stop finds them there even when nothing else tells they are the
// node's.
func (n *Node) runtimeCgroup() string { return n.CgroupRoot + "-runtime" }

// makeCgroups creates CgroupRoot (the kubelet checks that its cgroup root
// exists) and runtimeCgroup in every hierarchy, with the cpuset of the
// parent so tasks can join them.
func (n *Node) makeCgroups() error {
	mounts, err := procfs.CgroupMounts()
	if err != nil {
		return fmt.Errorf("controlplane: node: cgroups: %w", err)
	}
	for _, m := range mounts {
		for _, cg := range []string{n.CgroupRoot, n.runtimeCgroup()} {
			d := filepath.Join(m, cg)
			if err := os.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("controlplane: node: cgroup %s: %w", d, err)
			}
			n.impl.cgroupDirs = append(n.impl.cgroupDirs, d)
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(m, f))
				if err != nil {
					continue // not the v1 cpuset hierarchy
				}
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("controlplane: node: cgroup %s: %w", d, err)
				}
			}
		}
	}
	return nil
}

// runtimeCgroupProcs lists the cgroup.procs file of runtimeCgroup in
// every hierarchy: makeCgroups made them.
func (n *Node) runtimeCgroupProcs() []string {
	var out []string
	for _, d := range n.impl.cgroupDirs {
		if filepath.Base(d) == filepath.Base(n.runtimeCgroup()) {
			out = append(out, filepath.Join(d, "cgroup.procs"))
		}
	}
	return out
}

// startMountNamespace starts the process that holds the node's mount
// namespace: the kernel makes it with CLONE_NEWNS (Go marks every mount
// private in it first), the shell binds the node's directories and says
// "ready" on fd 3, then sleeps until Stop ends it. Every other node
// process enters the namespace with nsenter.
func (n *Node) startMountNamespace(ctx context.Context) error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	defer r.Close()
	script := `set -e
mount --bind "$1" /var/lib
mount --bind "$2" /var/log
mount --bind "$3" /run
echo ready >&3
exec 3>&-
exec sleep infinity`
	p, err := startSpec(procSpec{
		name: "mountns", path: "/bin/sh", logPath: n.LogPath("mountns"),
		args:       []string{"-c", script, "mountns", filepath.Join(n.Dir, "var-lib"), filepath.Join(n.Dir, "var-log"), filepath.Join(n.Dir, "run")},
		extraFiles: []*os.File{w},
		sys:        &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL},
	})
	w.Close()
	if err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	n.impl.mountns = p
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if s != "ready\n" {
			<-p.done
			return fmt.Errorf("controlplane: node: %w", p.failure(errors.New("could not set up the mount namespace")))
		}
	case <-ctx.Done():
		return fmt.Errorf("controlplane: node: %w", p.failure(ctx.Err()))
	}
	return nil
}

// inNode starts a process inside the node's mount namespace. nsenter execs
// the program, so the process's PID is the program's.
func (n *Node) inNode(name, path string, args, env []string, appendLog bool) (*process, error) {
	return n.inNodeCgroup(name, path, args, env, appendLog, nil)
}

// joinCgroups is the shell that puts itself in the cgroups whose
// cgroup.procs files come first (their count in $1) and then execs the
// rest of its arguments: the program runs in those cgroups from its first
// instruction, and its PID is the shell's.
const joinCgroups = `n=$1; shift
while [ "$n" -gt 0 ]; do echo $$ > "$1"; shift; n=$((n - 1)); done
exec "$@"`

// inNodeCgroup is inNode with the process in the cgroups whose
// cgroup.procs files are procs (none: the test's own).
func (n *Node) inNodeCgroup(name, path string, args, env []string, appendLog bool, procs []string) (*process, error) {
	full := append([]string{"nsenter", "--target", strconv.Itoa(n.impl.mountns.pid()), "--mount", "--", path}, args...)
	if len(procs) > 0 {
		full = append(append([]string{"-c", joinCgroups, "join-cgroups", strconv.Itoa(len(procs))}, procs...), full...)
		return startSpec(procSpec{name: name, path: "/bin/sh", logPath: n.LogPath(name), args: full, env: env, appendLog: appendLog})
	}
	return startSpec(procSpec{name: name, path: full[0], logPath: n.LogPath(name), args: full[1:], env: env, appendLog: appendLog})
}

func (n *Node) containerdConfig() string {
	return `# The test node's containerd (written by test/controlplane).
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins.'io.containerd.internal.v1.opt']
  path = "/var/lib/containerd/opt"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '` + PauseImage + `'

[plugins.'io.containerd.cri.v1.runtime']
  # The machine's root may lack CAP_SYS_RESOURCE: runc cannot lower
  # oom_score_adj below containerd's own (the pause container's -998).
  restrict_oom_score_adj = true
  cdi_spec_dirs = ['/var/run/cdi']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      SystemdCgroup = false
      BinaryName = '` + n.impl.runc + `'
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = '` + filepath.Join(n.Dir, "etc", "cni") + `'

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
`
}

// cniConfig gives each pod a veth pair to the host with an address from
// PodSubnet: the kubelet probes pods at their IP from the host's network
// namespace, so a pod address must be reachable from there. No
// masquerading, so pods reach the host and nothing beyond it.
func (n *Node) cniConfig() string {
	return `{
  "cniVersion": "1.0.0",
  "name": "dpkit-test-node",
  "plugins": [{
    "type": "ptp",
    "ipMasq": false,
    "ipam": {
      "type": "host-local",
      "ranges": [[{"subnet": "` + n.PodSubnet + `"}]],
      "routes": [{"dst": "0.0.0.0/0"}],
      "dataDir": "/var/lib/cni/networks"
    }
  }]
}
`
}

// startContainerd starts containerd and waits until it answers; restart
// keeps its log.
func (n *Node) startContainerd(ctx context.Context, restart bool) error {
	conf := filepath.Join(n.Dir, "etc", "containerd.toml")
	if err := os.WriteFile(conf, []byte(n.containerdConfig()), 0o644); err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "etc", "cni", "10-dpkit-test-node.conflist"), []byte(n.cniConfig()), 0o644); err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	// The shim containerd starts is looked up in PATH: the one built with
	// it must come first (not a containerd 1.x shim from the system).
	env := []string{"PATH=" + filepath.Dir(n.impl.bins["containerd-shim-runc-v2"]) + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	p, err := n.inNodeCgroup("containerd", n.impl.bins["containerd"], []string{"--config", conf}, env, restart, n.runtimeCgroupProcs())
	if err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	n.impl.mu.Lock()
	n.impl.containerd = p
	n.impl.mu.Unlock()
	if err := waitFor(ctx, p, func(ctx context.Context) error {
		_, err := n.Ctr(ctx, "version")
		return err
	}); err != nil {
		return err
	}
	return nil
}

// Ctr runs ctr against the node's containerd in the kubelet's namespace
// (k8s.io) and returns its standard output.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, n.impl.bins["ctr"], full...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// ImportImage imports an OCI archive (what ociimage and `make image`
// write, or `docker save`) into the node's containerd, where pods use it
// with imagePullPolicy Never or IfNotPresent.
func (n *Node) ImportImage(ctx context.Context, archive string) error {
	if _, err := n.Ctr(ctx, "images", "import", "--snapshotter", "overlayfs", archive); err != nil {
		return fmt.Errorf("controlplane: node: import %s: %w", archive, err)
	}
	return nil
}

// BaseImages are the sandbox image (PauseImage, running pauseBinary) and
// BusyboxImage (BusyboxBinary and its applets, root's and nobody's
// passwd and group entries, /root and /tmp) that the node imports. A
// containerd of a test's own imports the same, so that both give a
// container the same files and environment: runc sets HOME from the
// image's /etc/passwd, / without one.
func BaseImages(ctx context.Context, pauseBinary string) ([]ociimage.Image, error) {
	list, err := exec.CommandContext(ctx, BusyboxBinary, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("controlplane: %s --list: %w (install busybox-static)", BusyboxBinary, err)
	}
	busybox := ociimage.Image{
		Name: BusyboxImage, OS: "linux", Architecture: goarch(),
		Config: ociimage.Config{Env: []string{"PATH=/bin"}, Cmd: []string{"sh"}},
		Files: []ociimage.File{
			{Path: "/bin/busybox", Mode: 0o755, Source: BusyboxBinary},
			{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
			{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnogroup:x:65534:\n")},
			{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
			{Path: "/root", Mode: fs.ModeDir | 0o700},
		},
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" {
			busybox.Files = append(busybox.Files, ociimage.File{Path: "/bin/" + applet, Mode: fs.ModeSymlink | 0o777, Target: "busybox"})
		}
	}
	pause := ociimage.Image{
		Name: PauseImage, OS: "linux", Architecture: goarch(),
		Config: ociimage.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"},
		Files:  []ociimage.File{{Path: "/pause", Mode: 0o755, Source: pauseBinary}},
	}
	return []ociimage.Image{pause, busybox}, nil
}

// importBaseImages packs and imports BaseImages.
func (n *Node) importBaseImages(ctx context.Context) error {
	images, err := BaseImages(ctx, n.impl.bins["pause"])
	if err != nil {
		return err
	}
	for _, img := range images {
		archive := filepath.Join(n.Dir, "etc", strings.ReplaceAll(filepath.Base(img.Name), ":", "_")+".oci.tar")
		if _, err := ociimage.WriteFile(archive, img); err != nil {
			return fmt.Errorf("controlplane: node: %w", err)
		}
		if err := n.ImportImage(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) kubeletConfig(port, healthzPort int) string {
	return `# The test node's kubelet (written by test/controlplane).
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: ` + n.CgroupRoot + `
# The machines this runs on may mount cgroup v1 hierarchies.
failCgroupV1: false
failSwapOn: false
address: 127.0.0.1
port: ` + strconv.Itoa(port) + `
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ` + strconv.Itoa(healthzPort) + `
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: ` + strconv.Quote(n.impl.cp.ClientCAFile) + `}
authorization: {mode: AlwaysAllow}
volumePluginDir: /var/lib/kubelet/volumeplugins
# Tests wait for allocatable on the Node object: report it every second
# (the default is 10 s).
nodeStatusUpdateFrequency: 1s
# A test machine's disk is shared and may be full-ish: no eviction, no
# image garbage collection (the images are imported, never pulled).
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`
}

func (n *Node) startKubelet(ctx context.Context) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	conf := filepath.Join(n.Dir, "etc", "kubelet.yaml")
	if err := os.WriteFile(conf, []byte(n.kubeletConfig(ports[0], ports[1])), 0o644); err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	kubeconfig, err := n.impl.cp.KubeconfigFor("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	n.impl.healthzURL = "http://127.0.0.1:" + strconv.Itoa(ports[1]) + "/healthz"
	n.impl.kubeletArgs = []string{
		"--config=" + conf,
		"--kubeconfig=" + kubeconfig,
		"--hostname-override=" + n.Name,
		"--v=2",
	}
	return n.runKubelet(ctx, false)
}

// runKubelet starts the kubelet and waits for its /healthz.
func (n *Node) runKubelet(ctx context.Context, restart bool) error {
	p, err := n.inNode("kubelet", n.impl.bins["kubelet"], n.impl.kubeletArgs, nil, restart)
	if err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	n.impl.mu.Lock()
	n.impl.kubelet = p
	n.impl.mu.Unlock()
	return waitFor(ctx, p, func(ctx context.Context) error {
		return httpOK(ctx, http.DefaultClient, n.impl.healthzURL)
	})
}

// waitSchedulable waits for the Node to be Ready without the not-ready
// taint. kube-controller-manager's node lifecycle controller lifts the
// taint; without one StartNode lifts it itself.
func (n *Node) waitSchedulable(ctx context.Context) error {
	client := n.impl.cp.Client()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last := "not registered"
	for {
		node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		switch {
		case err == nil:
			ready := false
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready = c.Status == corev1.ConditionTrue
					last = fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message)
				}
			}
			tainted := slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
			if ready && !tainted {
				return nil
			}
			if ready && n.impl.cp.ControllerManagerURL == "" {
				patch := []byte(`{"spec":{"taints":null}}`)
				if _, err := client.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
					last = "remove not-ready taint: " + err.Error()
				}
			} else if ready {
				last = "Ready, waiting for the node lifecycle controller to remove the not-ready taint"
			}
		case !apierrors.IsNotFound(err):
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("controlplane: node %s not schedulable (%s): %w\n--- last lines of %s ---\n%s",
				n.Name, last, ctx.Err(), n.LogPath("kubelet"), tailFile(n.LogPath("kubelet"), 30))
		case <-n.impl.kubelet.done:
			return fmt.Errorf("controlplane: node: %w", n.impl.kubelet.failure(errors.New("exited before the node was Ready")))
		case <-tick.C:
		}
	}
}

// Binary returns the path of one of the node's binaries ("kubelet",
// "containerd", "containerd-shim-runc-v2", "ctr", "pause").
func (n *Node) Binary(name string) string { return n.impl.bins[name] }

// PIDs returns the process ids of the node's components by name:
// "mountns" (the process holding the mount namespace), "containerd",
// "kubelet" (the running one).
func (n *Node) PIDs() map[string]int {
	n.impl.mu.Lock()
	defer n.impl.mu.Unlock()
	out := map[string]int{}
	for name, p := range map[string]*process{"mountns": n.impl.mountns, "containerd": n.impl.containerd, "kubelet": n.impl.kubelet} {
		if p != nil {
			out[name] = p.pid()
		}
	}
	return out
}

// KubeletPID returns the running kubelet's process id.
func (n *Node) KubeletPID() int {
	n.impl.mu.Lock()
	defer n.impl.mu.Unlock()
	return n.impl.kubelet.pid()
}

// RestartKubelet stops the kubelet with sig (SIGTERM: a clean shutdown;
// SIGKILL: a crash), waits for it to exit, starts it again with the same
// configuration and waits for its /healthz. Running containers are
// containerd's and keep running meanwhile.
func (n *Node) RestartKubelet(ctx context.Context, sig syscall.Signal) error {
	n.impl.mu.Lock()
	old := n.impl.kubelet
	n.impl.mu.Unlock()
	if err := old.stopWith(sig, 30*time.Second); err != nil {
		return fmt.Errorf("controlplane: node: %w", err)
	}
	n.impl.logger.Info("Kubelet stopped", "signal", sig, "pid", old.pid())
	return n.runKubelet(ctx, true)
}

// Reboot cuts the node's power and boots it again: every process of the
// node (the kubelet, containerd, its shims and every container) is killed
// with SIGKILL at once; then containerd starts and, once it answers, the
// kubelet, which starts again what it should run (a DaemonSet's pods
// among it: they start after the kubelet, as on a real boot) and finds
// the containers that ran before dead. What is on disk stays: the
// kubelet's checkpoints, containerd's images and containers, the CNI's
// address leases. The node's cgroups are made afresh. /run stays (a real
// boot empties it): containerd cleans the state of the shims that died
// as it starts. It returns once
// the kubelet's /healthz answers.
func (n *Node) Reboot(ctx context.Context) error {
	im := &n.impl
	im.mu.Lock()
	kubelet, containerd, stopped := im.kubelet, im.containerd, im.stopped
	im.mu.Unlock()
	if stopped {
		return errors.New("controlplane: node: Reboot: the node is stopped")
	}
	killed, err := EndProcesses(ctx, AnyOf(InCgroupTrees(im.cgroupDirs...), InMountNamespaceOf(im.mountns.pid())))
	if err != nil {
		return fmt.Errorf("controlplane: node: reboot: %w", err)
	}
	for _, p := range []*process{kubelet, containerd} {
		select {
		case <-p.done:
		case <-ctx.Done():
			return fmt.Errorf("controlplane: node: reboot: %s did not exit: %w", p.name, ctx.Err())
		}
	}
	im.logger.Info("Node powered off", "processes", len(killed))
	// A machine boots with no cgroup but the root's: the dead
	// containers' would each hold the kubelet's start up (cAdvisor
	// tries to watch them).
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	found, err := RemoveCgroupTreesWhenEmpty(rctx, im.cgroupDirs...)
	cancel()
	if len(found) > 0 {
		// Rare, and worth seeing in a test's output: the logger is
		// often discarded.
		fmt.Fprintf(os.Stderr, "controlplane: node: reboot: the node's cgroups still listed tasks after its processes ended; killed: %v\n", found)
		im.logger.Warn("The node's cgroups still listed tasks after its processes ended; killed", "tasks", found)
	}
	if err != nil {
		return fmt.Errorf("controlplane: node: reboot: %w", err)
	}
	im.cgroupDirs = nil
	if err := n.makeCgroups(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx, true); err != nil {
		return err
	}
	return n.runKubelet(ctx, true)
}

// Stop stops the node and puts the host back as it was: the kubelet
// (SIGTERM), then every pod sandbox through the runtime's CRI API (as
// `crictl rmp -fa`), every other container through containerd,
// containerd; then whatever still runs in the node's cgroups or its mount
// namespace (a shim outlives its containerd; a container the runtime
// could not stop) is killed, the mount namespace ended, the node's
// cgroups removed and the sysctls the kubelet and the CNI plugin changed
// restored. The error names every process it had to kill that way and
// anything it could not undo. Dir is removed with the control plane's.
// Safe to call more than once.
func (n *Node) Stop() error {
	im := &n.impl
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.stopped {
		return im.stopErr
	}
	im.stopped = true
	var errs []error
	if im.kubelet != nil {
		if err := im.kubelet.stop(30 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if im.containerd != nil {
		if done, _ := im.containerd.exited(); !done {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			var rerrs []error
			if err := RemoveAllPods(ctx, n.ContainerdSocket); err != nil {
				rerrs = append(rerrs, err)
			}
			cancel()
			if err := n.removeContainers(); err != nil {
				rerrs = append(rerrs, err)
			}
			if len(rerrs) > 0 {
				// The runtime may have died just before it was asked
				// (crashed, killed) and not been reaped yet: its answers
				// then say only that. No one is left to remove pods
				// through; endLeftovers ends the shims and containers.
				select {
				case <-im.containerd.done:
					rerrs = nil
				case <-time.After(5 * time.Second):
				}
			}
			errs = append(errs, rerrs...)
		}
		if err := im.containerd.stop(10 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	if im.mountns != nil {
		if done, err := im.mountns.exited(); done {
			// Only the node's cgroups still tell which processes are
			// the node's: the runtime's shims are found there.
			im.logger.Warn("The node's mount namespace holder ended before the node stopped", "err", err)
		}
	}
	if err := im.endLeftovers(); err != nil {
		errs = append(errs, err)
	}
	if im.mountns != nil {
		if err := im.mountns.stop(5 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	found, err := RemoveCgroupTreesWhenEmpty(ctx, im.cgroupDirs...)
	cancel()
	if len(found) > 0 {
		im.logger.Warn("The node's cgroups still listed tasks after its processes ended; killed", "tasks", found)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if err := n.leaveHost(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		im.stopErr = fmt.Errorf("controlplane: stop node: %w", err)
	}
	return im.stopErr
}

// endLeftovers kills what the runtime left: processes in the node's
// cgroups (the pods' below CgroupRoot, containerd's shims in
// runtimeCgroup), and those in its mount namespace but its holder. With
// the sandboxes removed and containerd stopped there should be none but
// containerd's shims, which end with their last task; any other is
// logged by name, so a test that leaves one behind shows in the log.
func (im *nodeImpl) endLeftovers() error {
	var match []ProcessMatcher
	if len(im.cgroupDirs) > 0 {
		match = append(match, InCgroupTrees(im.cgroupDirs...))
	}
	if im.mountns != nil {
		if done, _ := im.mountns.exited(); !done {
			match = append(match, InMountNamespaceOf(im.mountns.pid()))
		}
	}
	if len(match) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	killed, err := EndProcesses(ctx, AnyOf(match...))
	for _, k := range killed {
		im.logger.Info("Killed a process the node's runtime left behind", "process", k)
	}
	if err != nil {
		return fmt.Errorf("end the node's processes: %w", err)
	}
	return nil
}

// removeContainers kills and deletes every task and container containerd
// runs for the kubelet; a shim ends with its last task. A task may vanish
// while this runs (its sandbox's shim ending first), so what counts is
// that none is left at the end.
func (n *Node) removeContainers() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := n.Ctr(ctx, "containers", "list", "--quiet")
	if err != nil {
		return err
	}
	ids := strings.Fields(string(out))
	for _, id := range ids {
		_, _ = n.Ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
	}
	for _, id := range ids {
		_, _ = n.Ctr(ctx, "tasks", "delete", "--force", id)
		_, _ = n.Ctr(ctx, "containers", "delete", id)
	}
	left, err := n.Ctr(ctx, "tasks", "list", "--quiet")
	if err != nil {
		return err
	}
	if ids := strings.Fields(string(left)); len(ids) > 0 {
		return fmt.Errorf("containerd still runs tasks %s after they were killed and deleted", strings.Join(ids, ", "))
	}
	return nil
}

func goarch() string { return runtime.GOARCH }
