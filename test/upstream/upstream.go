// Package upstream locates binaries built from upstream Kubernetes code
// (v1.37.0) that dpkit's interoperability tests run against:
//
//   - sample-device-plugin: k8s.io/kubernetes/test/images/sample-device-plugin,
//     the device plugin the Kubernetes node e2e tests use, unchanged. It
//     serves example.com/resource with devices Dev-1 and Dev-2.
//   - kubelet-devicemanager: hack/tools/cmd/kubelet-devicemanager, the
//     kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager)
//     run standalone with a line protocol on stdin/stdout.
//   - kubelet-dramanager: hack/tools/cmd/kubelet-dramanager, the kubelet's
//     own DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra) and plugin
//     watcher, run standalone with a line protocol on stdin/stdout.
//
// hack/build-upstream.sh builds them into
// ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/upstream/v1.37.0, or into the
// directory named by DPKIT_UPSTREAM_BIN. Tests that need them fail with the
// build command when they are missing, and skip under -short. See
// docs/upstream-interop.md.
package upstream

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/repopath"
)

// Version is the Kubernetes version the binaries are built from.
const Version = "v1.37.0"

// EnvBinDir names the environment variable that overrides where the
// binaries are looked up (and where hack/build-upstream.sh puts them).
const EnvBinDir = "DPKIT_UPSTREAM_BIN"

// BuildScript is the repository-relative script that builds the binaries.
const BuildScript = "hack/build-upstream.sh"

// Binary names, as found in BinDir().
const (
	SamplePluginName  = "sample-device-plugin"
	DeviceManagerName = "kubelet-devicemanager"
	DRAManagerName    = "kubelet-dramanager"
)

// Facts about the upstream sample device plugin at Version.
const (
	// SampleResource is the resource the sample plugin serves.
	SampleResource = "example.com/resource"
	// SampleSocketPrefix starts the name of the socket the sample plugin
	// creates in its socket directory: "dp." followed by Unix seconds.
	SampleSocketPrefix = "dp."
	// EnvSampleSockDir is the sample plugin's environment variable naming
	// the directory of its socket (default /var/lib/kubelet/device-plugins).
	EnvSampleSockDir = "PLUGIN_SOCK_DIR"
	// EnvSampleRegisterControlFile, when set, stops the sample plugin from
	// registering through kubelet.sock until that file is deleted.
	EnvSampleRegisterControlFile = "REGISTER_CONTROL_FILE"
)

// SampleDevices returns the IDs of the devices the sample plugin serves,
// all healthy, without NUMA topology.
func SampleDevices() []string { return []string{"Dev-1", "Dev-2"} }

// SampleMount returns the host path the sample plugin's Allocate mounts for
// a device (it creates an empty file there).
func SampleMount(deviceID string) string { return filepath.Join("/tmp", deviceID) }

// SamplePluginEnv returns the environment that makes the sample plugin
// register through the plugin watcher: its socket goes to registryDir (a
// kubelet's plugins_registry directory), and its own kubelet.sock
// registration, hard-coded to /var/lib/kubelet/device-plugins/kubelet.sock,
// is held back by controlFile (any path whose parent directory exists; the
// file need not exist, and must not be deleted while the plugin runs).
// The result starts with os.Environ().
//
// The sample plugin cannot be pointed at another kubelet.sock: only the
// directory of its own socket is configurable. Registering through
// plugins_registry is the path the kubelet offers such plugins: the
// watcher calls GetInfo on the socket, which answers DevicePlugin,
// SampleResource and an empty endpoint, meaning the socket itself.
func SamplePluginEnv(registryDir, controlFile string) []string {
	return append(os.Environ(),
		EnvSampleSockDir+"="+registryDir,
		EnvSampleRegisterControlFile+"="+controlFile,
	)
}

// ErrBinariesMissing is wrapped by Find's error when a binary is not built;
// the message gives the command that builds it.
var ErrBinariesMissing = errors.New("upstream binaries missing")

// DefaultBinDir is where hack/build-upstream.sh puts the binaries when
// DPKIT_UPSTREAM_BIN is not set.
func DefaultBinDir() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "dpkit", "upstream", Version)
}

// BinDir returns $DPKIT_UPSTREAM_BIN, or DefaultBinDir when it is unset.
func BinDir() string {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d
	}
	return DefaultBinDir()
}

// Find returns the path of the named binary in dir (BinDir() when dir is
// empty), or an error wrapping ErrBinariesMissing that names the build
// command.
func Find(dir, name string) (string, error) {
	if dir == "" {
		dir = BinDir()
	}
	p := filepath.Join(dir, name)
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("upstream: %w: %s not found in %s; build it with: %s",
			ErrBinariesMissing, name, dir, BuildCommand(dir))
	}
	return p, nil
}

// SkipMessage is what tests print when -short skips them.
const SkipMessage = "needs binaries built from upstream Kubernetes " + Version + "; skipped under -short. Run without -short after: bash " + BuildScript

// SamplePlugin returns the path of the upstream sample device plugin. Under
// -short it skips t; otherwise a missing binary fails t with the command
// that builds it.
func SamplePlugin(t testing.TB) string {
	t.Helper()
	return mustFind(t, SamplePluginName)
}

// DeviceManager returns the path of kubelet-devicemanager, the kubelet's
// device manager run standalone. Under -short it skips t; otherwise a
// missing binary fails t with the command that builds it.
func DeviceManager(t testing.TB) string {
	t.Helper()
	return mustFind(t, DeviceManagerName)
}

// DRAManager returns the path of kubelet-dramanager, the kubelet's DRA
// manager run standalone. Under -short it skips t; otherwise a missing
// binary fails t with the command that builds it.
func DRAManager(t testing.TB) string {
	t.Helper()
	return mustFind(t, DRAManagerName)
}

func mustFind(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip(SkipMessage)
	}
	p, err := Find("", name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// BuildCommand is the shell command that builds the binaries into dir.
func BuildCommand(dir string) string {
	cmd := "bash " + repopath.Find(BuildScript)
	if dir != DefaultBinDir() {
		cmd = EnvBinDir + "=" + shellQuote(dir) + " " + cmd
	}
	return cmd
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Command returns an exec.Cmd for one of the binaries that dies with the
// test binary (on Linux, by the parent-death signal), so a crashed test
// leaves no plugin or kubelet running. The caller starts it and stops it.
func Command(path string, args ...string) *exec.Cmd {
	cmd := exec.Command(path, args...)
	cmd.SysProcAttr = sysProcAttr()
	return cmd
}
