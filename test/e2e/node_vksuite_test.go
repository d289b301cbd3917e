package e2e

import (
	"testing"
	"time"

	vke2e "github.com/virtual-kubelet/virtual-kubelet/test/e2e"

	"github.com/dpkit/dpkit/internal/noderun"
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
	c := cp.Client()
	access := newNodeAccess(t, cp)
	if access.direct != nil {
		t.Fatal("the virtual-kubelet suite reads the node through the API server's node proxy, which refuses loopback addresses: this machine has no other IPv4 address")
	}
	name := unique("vn-vk")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, shortTempDir(t), func(o *noderun.Options) {
		o.Backend, o.NodeIP = "sim", access.ip
	})
	ns := createNamespace(t, c, "vn-vk")
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
