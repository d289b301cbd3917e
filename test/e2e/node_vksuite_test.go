package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	vke2e "github.com/virtual-kubelet/virtual-kubelet/test/e2e"

	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/ociimage"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/test/controlplane"
)

// vkSuiteBugs are the tests of virtual-kubelet v1.12.0's e2e suite that
// no kubelet API behind authentication can pass, with the reason
// (docs/virtual-node.md has the table of results).
var vkSuiteBugs = map[string]string{
	"TestGetStatsSummary": "reads /stats/summary through the API server's pod proxy (pods/https:NODE:10250/proxy), " +
		"which expects virtual-kubelet to run in a pod named like the node and reaches it with no client credentials: " +
		"a node API with the kubelet's webhook authentication answers 401, as a kubelet does",
	"TestGetMetricsResource": "reads /metrics/resource through the API server's pod proxy, like TestGetStatsSummary: " +
		"401 from a node API with the kubelet's webhook authentication",
}

// TestVirtualNodeVKSuite runs virtual-kubelet v1.12.0's importable e2e
// suite (github.com/virtual-kubelet/virtual-kubelet/test/e2e) against a
// dpkit node with the sim backend. The suite's pods have images and no
// command, which the process backend does not run
// (CreateContainerConfigError), so every test of the suite that waits for
// a pod to be ready would time out there; the process backend's node API
// is covered by the other TestVirtualNode tests. The suite lists the
// node's pods through the API server's node proxy, which refuses loopback
// node addresses: the node gets the machine's other IPv4 address.
func TestVirtualNodeVKSuite(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	access := vkSuiteAccess(t, cp)
	name := unique("vn-vk")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, testdir.Short(t, "vn"), func(o *noderun.Options) {
		o.Backend, o.NodeIP = "sim", access.ip
	})
	runVKSuite(t, cp, name, "vn-vk")
}

// vkSuiteImages are the images the suite's pods name ("foo" in every test
// that runs, "bar" and "baz" beside it in the stats tests), as the runtime
// resolves them: no registry and no tag is docker.io/library/NAME:latest.
var vkSuiteImages = []string{"foo", "bar", "baz"}

// vkSuiteCmd is what the suite's images run, the suite's pods having no
// command: a shell that keeps running and exits 0 at once on SIGTERM. (A
// process that is PID 1 of its namespace gets no default action for
// SIGTERM: a bare "sleep" would wait out the grace period, 30 s, and be
// killed.)
var vkSuiteCmd = []string{"sh", "-c", `trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done`}

// TestVirtualNodeVKSuiteCRI runs the same suite against a dpkit node with
// the cri backend on a containerd of the test's own. The suite's pods run
// "foo" with no tag, so their pull policy is Always: the backend pulls it,
// as a kubelet does, every time a container starts. There is no network:
// the test serves docker.io/library/foo:latest (and bar, baz), busybox with
// vkSuiteCmd, from a registry of its own on loopback that containerd uses
// as its docker.io mirror, as an air-gapped cluster is set up; nothing is
// imported into containerd beforehand, so a pod runs only if its image was
// pulled.
func TestVirtualNodeVKSuiteCRI(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	access := vkSuiteAccess(t, cp)
	bins := os.Getenv(controlplane.EnvNodeBinDir)
	if bins == "" {
		bins = filepath.Clean(controlplane.DefaultNodeBinDir())
	}
	base, err := controlplane.BaseImages(ctx, filepath.Join(bins, "pause"))
	if err != nil {
		t.Fatal(err)
	}
	var imgs []ociimage.Image
	for _, img := range base {
		if img.Name != controlplane.BusyboxImage {
			continue
		}
		for _, n := range vkSuiteImages {
			img.Name = "docker.io/library/" + n + ":latest"
			img.Config.Cmd = vkSuiteCmd
			imgs = append(imgs, img)
		}
	}
	if len(imgs) != len(vkSuiteImages) {
		t.Fatalf("controlplane.BaseImages has no %s", controlplane.BusyboxImage)
	}
	reg := serveRegistry(t, imgs...)
	rtm := startContainerd(t, ctx, withDockerHubMirror(reg.addr))
	name := unique("vn-vkcri")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, testdir.Short(t, "vn"), func(o *noderun.Options) {
		rtm.use(o)
		o.NodeIP = access.ip
	})
	runVKSuite(t, cp, name, "vn-vkcri")
	// Five of the suite's tests run a pod of "foo" to Ready (TestGetPods,
	// the two lifecycle tests, the two optional-reference tests): with
	// policy Always each start pulls, though the image is there since the
	// first.
	if n := reg.pulls("library/foo"); n < 5 {
		t.Errorf("the registry was asked for library/foo:latest %d times, want a pull for each of the suite's 5 pods that run (pull policy Always)", n)
	} else {
		t.Logf("the registry was asked for library/foo:latest %d times", n)
	}
}

// vkSuiteAccess returns the machine's non-loopback address for the node:
// the suite reads the node through the API server's node proxy, which
// refuses loopback addresses.
func vkSuiteAccess(t *testing.T, cp *controlplane.ControlPlane) *nodeAccess {
	t.Helper()
	access := newNodeAccess(t, cp)
	if access.direct != nil {
		t.Fatal("the virtual-kubelet suite reads the node through the API server's node proxy, which refuses loopback addresses: this machine has no other IPv4 address")
	}
	return access
}

// runVKSuite runs the suite against node name in a new namespace, skipping
// vkSuiteBugs.
func runVKSuite(t *testing.T, cp *controlplane.ControlPlane, name, nsPrefix string) {
	t.Helper()
	ns := createNamespace(t, cp.Client(), nsPrefix)
	suite := vke2e.NewEndToEndTestSuite(vke2e.EndToEndTestSuiteConfig{
		Kubeconfig:   cp.Kubeconfig,
		Namespace:    ns,
		NodeName:     name,
		WatchTimeout: time.Minute,
		ShouldSkipTest: func(test string) bool {
			if why, ok := vkSuiteBugs[test]; ok {
				t.Logf("skipping %s, a bug of the suite: %s", test, why)
				return true
			}
			return false
		},
	})
	suite.Run(t)
}
