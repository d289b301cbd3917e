package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode"
)

// simShardNodes is how many virtual nodes each replica of the simulator
// StatefulSet runs in TestRealNodeSimulatorStatefulSet.
const simShardNodes = 25

// TestRealNodeSimulatorStatefulSet deploys deploy/simulator (the full
// image, imported into the node) on the real node (kubelet, containerd,
// runc) with 2 replicas of 25 nodes each, as a user's overlay does: the
// API server is reached with a kubeconfig from a Secret whose client
// certificate is the StatefulSet's ServiceAccount (the test node has no
// Service proxy), so the shipped ClusterRole is what the nodes are
// allowed. All 50 virtual nodes, two shards of distinct names, become
// Ready with their devices allocatable and published in ResourceSlices,
// and 100 pods asking for a device are scheduled on both shards and run.
func TestRealNodeSimulatorStatefulSet(t *testing.T) {
	cp, n := realNode.Get(t)
	importFullImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()

	kubeconfig, err := cp.KubeconfigFor("system:serviceaccount:dpkit-sim:dpkit-sim", "system:serviceaccounts", "system:serviceaccounts:dpkit-sim")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	dir := fullImageOverlay(t, filepath.Join("deploy", "simulator"), "dpkit-sim", data, "", fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: dpkit-sim
  namespace: dpkit-sim
spec:
  template:
    spec:
      hostNetwork: true
      # Only the real node: the suite's virtual nodes are Nodes too.
      nodeSelector:
        kubernetes.io/hostname: %s
      containers:
      - name: node
        env:
        - {name: NODES, value: "%d"}
        - {name: KUBECONFIG, value: /etc/dpkit-kube/kubeconfig}
        volumeMounts:
        - {name: e2e-kubeconfig, mountPath: /etc/dpkit-kube, readOnly: true}
      volumes:
      - name: e2e-kubeconfig
        secret:
          secretName: dpkit-e2e-kubeconfig
          defaultMode: 0444
`, n.Name, simShardNodes))
	d := deployment{objs: render(t, "kustomize", dir), namespace: "dpkit-sim"}
	var shards []string
	for i := range 2 {
		shards = append(shards, fmt.Sprintf("dpkit-sim-%d", i))
	}
	t.Cleanup(func() {
		for _, shard := range shards {
			deleteNodes(t, c, shard, simShardNodes)
		}
	})
	d.apply(t, ctx, cp)

	res := corev1.ResourceName("example.com/gpu")
	poll(t, ctx, fmt.Sprintf("%d virtual nodes Ready with 8 %s, published in ResourceSlices", 2*simShardNodes, res), func(ctx context.Context) (bool, string, error) {
		nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		ready := map[string]int{}
		for _, node := range nodes.Items {
			q := node.Status.Allocatable[res]
			for _, shard := range shards {
				if strings.HasPrefix(node.Name, shard+"-") && nodeReady(&node) && q.Value() == 8 {
					ready[shard]++
				}
			}
		}
		slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		published := 0
		for _, s := range slices.Items {
			if s.Spec.Driver == "gpu.example.com" && s.Spec.NodeName != nil && strings.HasPrefix(*s.Spec.NodeName, "dpkit-sim-") && len(s.Spec.Devices) == 8 {
				published++
			}
		}
		return ready[shards[0]] == simShardNodes && ready[shards[1]] == simShardNodes && published == 2*simShardNodes,
			fmt.Sprintf("Ready per shard %v, %d slices of 8 devices", ready, published), nil
	})

	var names []string
	for _, shard := range shards {
		for i := range simShardNodes {
			names = append(names, fmt.Sprintf("%s-%d", shard, i))
		}
	}
	ns := createNamespaceTB(t, c, "sim")
	const pods = 4 * simShardNodes
	for i := range pods {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: ns},
			Spec: corev1.PodSpec{
				Tolerations: []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists}},
				// The simulator's nodes, not other tests' virtual nodes.
				Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
					NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
						Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: names,
					}}}},
				}}},
				Containers: []corev1.Container{{Name: "app", Image: "none",
					Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse("1")}}}},
			},
		}
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, ctx, fmt.Sprintf("%d pods Running on both shards", pods), func(ctx context.Context) (bool, string, error) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, "", err
		}
		running, onShard := 0, map[string]int{}
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
				for _, shard := range shards {
					if strings.HasPrefix(p.Spec.NodeName, shard+"-") {
						onShard[shard]++
					}
				}
			}
		}
		return running == pods && onShard[shards[0]] > 0 && onShard[shards[1]] > 0, fmt.Sprintf("%d Running, per shard %v", running, onShard), nil
	})
}
