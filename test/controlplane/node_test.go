//go:build linux

package controlplane_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/dpkit/dpkit/test/controlplane"
)

func TestNodeMissingBinariesNameTheBuildCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := new(controlplane.ControlPlane).StartNode(context.Background(), controlplane.NodeOptions{BinDir: dir})
	if !errors.Is(err, controlplane.ErrBinariesMissing) {
		t.Fatalf("StartNode with empty BinDir: err = %v, want ErrBinariesMissing", err)
	}
	for _, want := range []string{"kubelet, containerd, containerd-shim-runc-v2, ctr, pause", dir, controlplane.EnvNodeBinDir + "=" + dir, "hack/build-node.sh"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// sysctls reads the kernel settings the node may change.
func sysctls(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, k := range []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward"} {
		b, err := os.ReadFile("/proc/sys/" + k)
		if err != nil {
			t.Fatal(err)
		}
		out[k] = strings.TrimSpace(string(b))
	}
	return out
}

// TestNode starts a real node, runs a pod on it through the scheduler,
// reads its log through the apiserver, restarts the kubelet under the
// running pod, then stops the node and checks that the host is as it was:
// no process, no cgroup, the sysctls restored.
func TestNode(t *testing.T) {
	if testing.Short() {
		t.Skip(controlplane.NodeSkipMessage)
	}
	// Several real nodes may run on this machine at once (go test runs
	// packages in parallel); the last to stop restores the sysctls.
	alone := otherNodes(t) == 0
	before := sysctls(t)
	cp := controlplane.StartForTest(t, controlplane.Options{Scheduler: true, ControllerManager: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := cp.StartNode(ctx, controlplane.NodeOptions{})
	if err != nil {
		t.Fatalf("StartNode: %v", err)
	}
	client := cp.Client()

	node, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Status.NodeInfo.ContainerRuntimeVersion; got != "containerd://2.4.2" {
		t.Errorf("container runtime %q, want containerd://2.4.2", got)
	}
	if got := node.Status.NodeInfo.KubeletVersion; got != controlplane.Version {
		t.Errorf("kubelet version %q, want %s", got, controlplane.Version)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "c", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Env:     []corev1.EnvVar{{Name: "GREETING", Value: "hello from the real node"}},
				Command: []string{"sh", "-c", `echo "$GREETING"; exec sleep 3600`},
			}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := func() *corev1.Pod {
		t.Helper()
		var last *corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			p, err := client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			last = p
			return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].Ready, nil
		})
		if err != nil {
			t.Fatalf("pod not running: %v; last status %+v", err, last.Status)
		}
		return last
	}
	first := running()
	if first.Spec.NodeName != n.Name || first.Status.PodIP == "" {
		t.Errorf("pod on node %q with IP %q", first.Spec.NodeName, first.Status.PodIP)
	}
	var logs []byte
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		logs, err = client.CoreV1().Pods("default").GetLogs("hello", &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && strings.Contains(string(logs), "hello from the real node"), nil
	}); err != nil {
		t.Fatalf("pod log through the apiserver: %q, %v", logs, err)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		old := n.KubeletPID()
		if err := n.RestartKubelet(ctx, sig); err != nil {
			t.Fatalf("restart kubelet (%v): %v", sig, err)
		}
		if n.KubeletPID() == old {
			t.Fatalf("kubelet pid %d unchanged after restart", old)
		}
		after := running()
		if got, want := after.Status.ContainerStatuses[0].ContainerID, first.Status.ContainerStatuses[0].ContainerID; got != want {
			t.Errorf("after a kubelet %v the container is %s, was %s: it should have kept running", sig, got, want)
		}
	}

	// A reboot: the pod's container dies with the node, and the kubelet,
	// booted again, runs a new one (restartPolicy Always).
	oldContainerd := n.PIDs()["containerd"]
	if err := n.Reboot(ctx); err != nil {
		t.Fatalf("reboot: %v", err)
	}
	if n.PIDs()["containerd"] == oldContainerd {
		t.Fatalf("containerd pid %d unchanged after a reboot", oldContainerd)
	}
	var rebooted *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		rebooted, err = client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		st := rebooted.Status.ContainerStatuses
		return len(st) == 1 && st[0].Ready && st[0].ContainerID != first.Status.ContainerStatuses[0].ContainerID, nil
	}); err != nil {
		t.Fatalf("after a reboot the pod's container did not run again: %v; last status %+v", err, rebooted.Status)
	}

	// A pod whose PID 1 ignores SIGTERM, deleted just before the node
	// stops: the kubelet is still waiting out its grace period when it
	// is stopped, and the pod still runs. Stop must end it.
	stubborn := pod.DeepCopy()
	stubborn.Name = "stubborn"
	stubborn.Spec.TerminationGracePeriodSeconds = ptr(int64(30))
	if _, err := client.CoreV1().Pods("default").Create(ctx, stubborn, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Get(ctx, "stubborn", metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning, nil
	}); err != nil {
		t.Fatalf("pod stubborn not running: %v", err)
	}
	if err := client.CoreV1().Pods("default").Delete(ctx, "stubborn", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	shim, err := filepath.EvalSymlinks(n.Binary("containerd-shim-runc-v2"))
	if err != nil {
		t.Fatal(err)
	}
	if shims := processesOf(t, shim); len(shims) == 0 {
		t.Fatalf("no %s runs while two pods do", shim)
	}
	// And the runtime is gone (crashed, killed), and so is the process
	// holding the node's mount namespace: the shims and their containers
	// run on, and only the node's cgroups still tell they are the node's
	// (the pods' below CgroupRoot, the shims' in the runtime's).
	pids := n.PIDs()
	for _, name := range []string{"containerd", "mountns"} {
		if err := syscall.Kill(pids[name], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}

	if err := n.Stop(); err != nil {
		t.Fatalf("stop node: %v", err)
	}
	for name, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after Stop: %v", name, pid, err)
		}
	}
	if shims := processesOf(t, shim); len(shims) > 0 {
		t.Errorf("containerd shims still run after Stop: %v", shims)
	}
	matches, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", n.CgroupRoot+"*"))
	if len(matches) > 0 {
		t.Errorf("cgroups left after Stop: %v", matches)
	}
	if others := otherNodes(t); !alone || others > 0 {
		t.Logf("other real nodes ran beside this one: the sysctls are the last one's to restore")
	} else if after := sysctls(t); !maps.Equal(after, before) {
		t.Errorf("sysctls after Stop %v, before StartNode %v", after, before)
	}
}

// otherNodes counts the real nodes of other test processes on this
// machine (their entries in /run/dpkit-test-node/nodes).
func otherNodes(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/run/dpkit-test-node/nodes")
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// processesOf lists the PIDs of the processes running the binary at path.
func processesOf(t *testing.T, path string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err == nil && exe == path {
			out = append(out, pid)
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }
