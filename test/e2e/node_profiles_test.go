package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/testdir"
)

// profileNodes is how many nodes TestVirtualNodeProfiles runs per
// profile.
const profileNodes = 3

// TestVirtualNodeProfiles: each shipped node profile (examples/profiles),
// served by one dpkit node --count --backend sim process as the profile
// says to run it (from the repository root, whose fixture hosts its host
// paths name), gives every node the devices the real plugin finds on the
// profile's fixture host, as allocatable and in its ResourceSlices. The
// profiles run one after the other.
func TestVirtualNodeProfiles(t *testing.T) {
	dpkitBinary(t) // before the test's deadline starts: a cold build takes minutes
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		profile string
		want    map[string]string // allocatable
		slices  map[string]int    // driver -> devices in each node's ResourceSlices
	}{
		{"dgx-h100", map[string]string{"nvidia.com/gpu": "8"}, map[string]int{"gpu.nvidia.com": 8}},
		{"mi300x", map[string]string{"amd.com/gpu": "64"}, map[string]int{"gpu.amd.com": 64}},
		{"mi250", map[string]string{"amd.com/gpu": "4"}, map[string]int{"gpu.amd.com": 4}},
		{"laptop", map[string]string{"dpkit.io/serial": "3", "dpkit.io/fuse": "16", "dpkit.io/tun": "16"},
			map[string]int{"serial.dpkit.io": 3, "fuse.dpkit.io": 16, "tun.dpkit.io": 16}},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			root := testdir.Short(t, "vp")
			// The node runs in root: the profile's relative host paths
			// resolve there as from the repository root.
			if err := os.Symlink(filepath.Join(repo, "pkg"), filepath.Join(root, "pkg")); err != nil {
				t.Fatal(err)
			}
			prefix := unique("vp")
			t.Cleanup(func() { deleteNodes(t, c, prefix, profileNodes) })
			startProc(t, filepath.Join(root, "node.log"), os.Environ(), filepath.Join(filepath.Dir(dpkitBinary(t)), "dpkit-cluster"), "node",
				"--kubeconfig", cp.Kubeconfig, "--name", prefix, "--root", root, "--count", strconv.Itoa(profileNodes),
				"--backend", "sim", "--port", "-1", "--plugin-config", filepath.Join(repo, "examples", "profiles", tc.profile+".yaml"))
			poll(t, ctx, fmt.Sprintf("%d nodes Ready with %v", profileNodes, tc.want), func(ctx context.Context) (bool, string, error) {
				var off []string
				for i := range profileNodes {
					n, err := c.CoreV1().Nodes().Get(ctx, fmt.Sprintf("%s-%d", prefix, i), metav1.GetOptions{})
					if err != nil || !nodeReady(n) {
						off = append(off, fmt.Sprintf("%d not Ready", i))
						continue
					}
					for r, v := range tc.want {
						if q, ok := n.Status.Allocatable[corev1.ResourceName(r)]; !ok || q.String() != v {
							off = append(off, fmt.Sprintf("%d: %s=%s", i, r, q.String()))
						}
					}
				}
				return len(off) == 0, strings.Join(off, ", "), nil
			})
			poll(t, ctx, fmt.Sprintf("%d nodes publishing %v", profileNodes, tc.slices), func(ctx context.Context) (bool, string, error) {
				var off []string
				for i := range profileNodes {
					node := fmt.Sprintf("%s-%d", prefix, i)
					for driver, want := range tc.slices {
						devs, err := sliceDevices(ctx, c, node, driver)
						if err != nil {
							return false, "", err
						}
						if len(devs) != want {
							off = append(off, fmt.Sprintf("%s: %d %s devices", node, len(devs), driver))
						}
					}
				}
				return len(off) == 0, strings.Join(off, ", "), nil
			})
		})
	}
}
