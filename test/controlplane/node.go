package controlplane

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// The test node's fixed names.
const (
	// NodeName is the real node's name and address. The kubelet refuses a
	// loopback --node-ip, but a host name that is an IP literal becomes the
	// Node's InternalIP without that check, and the apiserver reaches the
	// kubelet (logs, exec) on it.
	NodeName = "127.0.0.1"
	// PauseImage is the sandbox image the node's containerd is pinned to:
	// test/controlplane/cmd/pause, packed at start. Nothing is pulled.
	PauseImage = "dpkit.test/pause:3.10"
	// BusyboxImage is a busybox image (Debian's busybox-static) for test
	// pods, imported at start; pods use it with imagePullPolicy: Never.
	BusyboxImage = "dpkit.test/busybox:latest"
	// BusyboxBinary is where the busybox image's binary comes from.
	BusyboxBinary = "/bin/busybox"
)

// EnvNodeBinDir names the environment variable that overrides where the
// node's binaries are looked up.
const EnvNodeBinDir = "DPKIT_NODE_BIN"

// EnvKubeletVersion names the environment variable that picks the real
// node's kubelet: v1.34.4, v1.35.4 or v1.36.3 for the version-skew matrix
// (make test-skew), the control plane's Version when unset.
const EnvKubeletVersion = "DPKIT_KUBELET_VERSION"

// SkewVersions are the kubelets the version-skew matrix runs, oldest
// first: every minor version a v1.37 control plane supports.
var SkewVersions = []string{"v1.34.4", "v1.35.4", "v1.36.3", Version}

// KubeletVersion returns the version of the real node's kubelet.
func KubeletVersion() string {
	if v := os.Getenv(EnvKubeletVersion); v != "" {
		return v
	}
	return Version
}

// KubeletMinor returns the minor version of the real node's kubelet (34
// for v1.34.4), for tests whose expectations depend on it.
func KubeletMinor() int {
	var major, minor, patch int
	if _, err := fmt.Sscanf(KubeletVersion(), "v%d.%d.%d", &major, &minor, &patch); err != nil {
		return 0
	}
	return minor
}

// NodeBuildScript is the repository-relative script that builds them.
const NodeBuildScript = "hack/build-node.sh"

// NodeSkipMessage is what tests print when -short skips them.
const NodeSkipMessage = "needs a real node (kubelet, containerd, runc, as root); skipped under -short. Run without -short after: bash " + BuildScript + " && bash " + NodeBuildScript

// ErrNodeUnsupported is wrapped by StartNode's error when the machine
// cannot run the node at all (not Linux, not root).
var ErrNodeUnsupported = errors.New("real node unsupported here")

// NodeOptions configure StartNode. The zero value is what tests use.
type NodeOptions struct {
	// BinDir holds kubelet, containerd, containerd-shim-runc-v2, ctr and
	// pause. Empty means $DPKIT_NODE_BIN, then DefaultNodeBinDir().
	BinDir string
	// StartTimeout bounds how long StartNode waits for the node to be
	// Ready and schedulable, on top of ctx. Zero means two minutes.
	StartTimeout time.Duration
	// Logger receives progress messages. Nil uses the control plane's.
	Logger *slog.Logger
}

// Node is a real node: a kubelet v1.37.0 on containerd 2.x and runc, its
// processes in a private mount namespace where /var/lib, /var/log and /run
// are directories under Dir, so the kubelet's fixed paths
// (/var/lib/kubelet/device-plugins/kubelet.sock among them) and
// containerd's are the node's own. Paths below are as seen from the host
// (the test); inside the node they are the usual ones.
type Node struct {
	// Name is the Node's name, NodeName.
	Name string
	// Dir holds every file of the node: etc/ (configurations), the
	// directories bound at /var/lib, /var/log and /run, and one log per
	// component (containerd.log, kubelet.log, mountns.log).
	Dir string
	// KubeletRoot is the kubelet's root directory (/var/lib/kubelet on
	// the node): device-plugins/, plugins_registry/, pod-resources/,
	// pods/. `dpkit get pods --root KubeletRoot` reads it.
	KubeletRoot string
	// CDIDir is where the node's containerd reads CDI specs
	// (/var/run/cdi on the node).
	CDIDir string
	// ContainerdSocket is containerd's socket (/run/containerd/containerd.sock
	// on the node); `ctr --address` takes it.
	ContainerdSocket string
	// PodLogDir holds the pods' logs (/var/log/pods on the node).
	PodLogDir string
	// CgroupRoot is the kubelet's cgroup root: every pod's cgroup is
	// below it, in every hierarchy.
	CgroupRoot string
	// PodSubnet is where pod IPs come from: 10.244.N.0/24, N unique among
	// the real nodes running on this machine at once.
	PodSubnet string

	impl nodeImpl
}

// DefaultNodeBinDir is where hack/build-node.sh puts the binaries when
// DPKIT_NODE_BIN is not set.
func DefaultNodeBinDir() string {
	return filepath.Join(filepath.Dir(DefaultBinDir()), "..", "node", KubeletVersion())
}

func (o NodeOptions) binDir() string {
	if o.BinDir != "" {
		return o.BinDir
	}
	if d := os.Getenv(EnvNodeBinDir); d != "" {
		return d
	}
	return filepath.Clean(DefaultNodeBinDir())
}
