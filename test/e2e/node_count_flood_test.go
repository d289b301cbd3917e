package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/testdir"
)

// floodNodes is how many nodes the termination message flood's process
// runs.
const floodNodes = 50

// TestVirtualNodeCountTerminationFlood: one `dpkit node --count 50
// --backend cri` process; a pod on its first node crash-loops, each run
// writing 256 MiB from /dev/zero to its termination message file. The
// node reads 4 KiB of it per run (the status carries 4096 bytes), keeps
// two runs' files, and the other 49 nodes renew their Leases throughout.
// The process's memory before, with an anchor pod crash-looping the same
// way with a one-line message, and with the flood, is logged for
// docs/security.md; nothing is timed.
func TestVirtualNodeCountTerminationFlood(t *testing.T) {
	dpkitBinary(t) // before the test's deadline starts: a cold build takes minutes
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	rtm := startContainerd(t, ctx)
	root := testdir.Short(t, "vn")
	prefix := unique("vnflood")
	// Registered first, so they run once the node process has stopped.
	t.Cleanup(func() { deleteNodes(t, c, prefix, floodNodes) })
	afterNodeStopsAt(t, root, floodNodes, prefix)
	node := startProc(t, filepath.Join(root, "node.log"), os.Environ(), filepath.Join(filepath.Dir(dpkitBinary(t)), "dpkit-cluster"), "node",
		"--kubeconfig", cp.Kubeconfig, "--name", prefix, "--root", root, "--count", strconv.Itoa(floodNodes),
		"--backend", "cri", "--cri-endpoint", "unix://"+rtm.socket, "--cgroup-root", rtm.cgroupRoot, "--port", "-1", "--node-ip", "127.0.0.1",
		"--restart-backoff", "1s", "--qps", "200", "--burst", "400")
	pid := node.cmd.Process.Pid // dpkit-cluster itself, which dpkit runs for node
	poll(t, ctx, fmt.Sprintf("%d nodes Ready", floodNodes), func(ctx context.Context) (bool, string, error) {
		ready := 0
		for i := range floodNodes {
			n, err := c.CoreV1().Nodes().Get(ctx, fmt.Sprintf("%s-%d", prefix, i), metav1.GetOptions{})
			if err == nil && nodeReady(n) {
				ready++
			}
		}
		return ready == floodNodes, fmt.Sprintf("%d Ready", ready), nil
	})
	idle := procStatusKiB(t, pid, "VmRSS:")
	ns := createNamespace(t, c, "vnflood")

	crashLoop := func(name, node, script string) *corev1.Pod {
		t.Helper()
		p := criPod(ns, name, node, script)
		p.Spec.RestartPolicy = corev1.RestartPolicyAlways
		if _, err := c.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				describePod(t, c, ns, name)
			}
		})
		end := waitPod(t, ctx, c, ns, name, "restarted 3 times", func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].RestartCount >= 3 && cs[0].LastTerminationState.Terminated != nil
		})
		// Stopped, so the figures below are those of 3 restarts.
		if err := c.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		return end
	}

	anchor := crashLoop("anchor", prefix+"-1", "echo one line >/dev/termination-log; exit 1")
	if msg := anchor.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message; msg != "one line\n" {
		t.Errorf("anchor's termination message %q", msg)
	}
	anchorHWM := procStatusKiB(t, pid, "VmHWM:")

	start := metav1.NewMicroTime(time.Now())
	flood := crashLoop("flood", prefix+"-0", "tr '\\0' A </dev/zero | head -c 268435456 >/dev/termination-log; exit 1")
	if msg := flood.Status.ContainerStatuses[0].LastTerminationState.Terminated.Message; len(msg) != 4096 || strings.Trim(msg, "A") != "" {
		t.Errorf("flood's termination message: %d bytes, want 4096 A's", len(msg))
	}
	floodHWM, rss := procStatusKiB(t, pid, "VmHWM:"), procStatusKiB(t, pid, "VmRSS:")
	files, _ := filepath.Glob(filepath.Join(root, prefix+"-0", "pods", string(flood.UID), "containers", "app", "*"))
	if len(files) > 2 {
		t.Errorf("%d termination message files after 3 restarts, want at most 2", len(files))
	}

	// Every other node renews its Lease after the flood began.
	poll(t, ctx, "the other nodes' Leases renewed during the flood", func(ctx context.Context) (bool, string, error) {
		var stale []string
		for i := 1; i < floodNodes; i++ {
			l, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, fmt.Sprintf("%s-%d", prefix, i), metav1.GetOptions{})
			if err != nil || !renewedAfter(l, start) {
				stale = append(stale, strconv.Itoa(i))
			}
		}
		return len(stale) == 0, "not yet renewed: " + strings.Join(stale, ","), nil
	})
	select {
	case <-node.done:
		t.Fatalf("dpkit node exited during the flood: %v", node.err)
	default:
	}
	t.Logf("dpkit node --count %d (cri): RSS idle %d MiB; peak with the anchor's 3 restarts %d MiB; peak after the flood's 3 restarts (256 MiB written each) %d MiB, RSS %d MiB",
		floodNodes, idle/1024, anchorHWM/1024, floodHWM/1024, rss/1024)
}

func renewedAfter(l *coordinationv1.Lease, t metav1.MicroTime) bool {
	return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(t.Time)
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// procStatusKiB reads a kB field of /proc/PID/status (VmRSS:, VmHWM:).
func procStatusKiB(t *testing.T, pid int, field string) uint64 {
	t.Helper()
	kb, err := statusKiB(pid, field)
	if err != nil {
		t.Fatal(err)
	}
	return kb
}

// statusKiB reads a kB field of /proc/PID/status.
func statusKiB(pid int, field string) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field); ok {
			return strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// afterNodeStopsAt unmounts, once the test's node process has stopped,
// the volumes its count nodes' cri backends left under root.
func afterNodeStopsAt(t *testing.T, root string, count int, prefix string) {
	t.Helper()
	for i := range count {
		afterNodeStops(t, noderun.Options{Backend: "cri", Root: filepath.Join(root, fmt.Sprintf("%s-%d", prefix, i))})
	}
}

// deleteNodes removes the Node objects of a --count run.
func deleteNodes(t *testing.T, c kubernetes.Interface, prefix string, count int) {
	t.Helper()
	for i := range count {
		_ = c.CoreV1().Nodes().Delete(context.Background(), fmt.Sprintf("%s-%d", prefix, i), metav1.DeleteOptions{})
	}
}
