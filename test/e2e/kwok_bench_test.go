package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dpkit/dpkit/pkg/virtualnode"
)

// kwokVersion is the kwok that hack/build-kwok.sh builds.
const kwokVersion = "v0.8.0"

// kwokDir is where hack/build-kwok.sh puts kwok and its stages:
// $DPKIT_KWOK_BIN, else ${XDG_CACHE_HOME:-$HOME/.cache}/dpkit/kwok/v0.8.0.
func kwokDir() string {
	if d := os.Getenv("DPKIT_KWOK_BIN"); d != "" {
		return d
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "dpkit", "kwok", kwokVersion)
}

// BenchmarkKwokSim is BenchmarkVirtualNodeSim with kwok (sigs.k8s.io/kwok)
// in place of dpkit's virtual nodes, for comparison: 10 fake nodes managed
// by one kwok process, each with 100 example.com/bench in its capacity and
// allocatable, kwok's default stages (those kwokctl installs) moving pods
// to Running, and the same 1 000 pods and measurement (runPodBench). kwok
// only sets status; nothing allocates devices. kwok is not part of the
// tests: the benchmark is skipped until it is built with
// hack/build-kwok.sh. Run with -benchtime=1x.
func BenchmarkKwokSim(b *testing.B) {
	kw := kwokBinaries(b)
	for _, s := range benchSchedulers {
		b.Run(s.name, func(b *testing.B) {
			cp, c := benchControlPlane(b, s.qps, s.burst)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			prefix := unique("kwok")

			pid, exited := startKwok(b, cp, kw, 0)
			for i := range benchNodes {
				if _, err := c.CoreV1().Nodes().Create(ctx, kwokNode(fmt.Sprintf("%s-%d", prefix, i)), metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
			for i := range benchNodes {
				name := fmt.Sprintf("%s-%d", prefix, i)
				err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
					select {
					case err := <-exited:
						return false, fmt.Errorf("kwok exited: %w", err)
					default:
					}
					n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						return false, nil
					}
					ready := false
					for _, cond := range n.Status.Conditions {
						ready = ready || cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue
					}
					if q := n.Status.Allocatable[benchResource]; !ready || q.Value() != 100 {
						return false, nil
					}
					// The API server taints new nodes not-ready; without
					// kube-controller-manager nothing lifts the taint once
					// kwok reports the node Ready (dpkit's virtual node
					// lifts its own), so do it here.
					taints := slices.DeleteFunc(slices.Clone(n.Spec.Taints), func(t corev1.Taint) bool { return t.Key == corev1.TaintNodeNotReady })
					if len(taints) == len(n.Spec.Taints) {
						return true, nil
					}
					n.Spec.Taints = taints
					_, _ = c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}) // then look again
					return false, nil
				})
				if err != nil {
					b.Fatalf("kwok node %s never Ready with 100 example.com/bench: %v", name, err)
				}
			}
			runPodBench(b, cp, c, prefix, map[string]int{"kwok": pid})
		})
	}
}

// kwokNode is a node for kwok to manage, shaped like the virtual nodes of
// BenchmarkVirtualNodeSim: the same capacity and the same taint.
func kwokNode(name string) *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1000"),
		corev1.ResourceMemory: resource.MustParse("1Ti"),
		corev1.ResourcePods:   resource.MustParse("1000"),
		benchResource:         resource.MustParse("100"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake"},
			Labels:      map[string]string{"kubernetes.io/hostname": name, "type": "kwok"},
		},
		Spec: corev1.NodeSpec{
			Taints: []corev1.Taint{{Key: virtualnode.DefaultTaintKey, Effect: corev1.TaintEffectNoSchedule}},
		},
		Status: corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}
