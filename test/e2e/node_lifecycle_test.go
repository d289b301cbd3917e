package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/noderun"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// TestVirtualNodeAdmissionFailure binds a pod asking for more devices than
// the node has straight to the node (spec.nodeName, no scheduler): the
// device manager rejects it, the pod ends Failed with the kubelet's reason,
// message and event, its container never runs, and no device is left
// assigned: a pod asking for all eight runs next.
func TestVirtualNodeAdmissionFailure(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-admit")
	n, _ := startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-admit")

	ran := filepath.Join(root, "ran")
	pod := boundPod(devicePod(ns, "too-many", name, "9", []string{"touch", ran}), name)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	failed := waitPod(t, ctx, c, ns, "too-many", "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	// The kubelet's texts: the device manager's error, wrapped by its
	// admission handler, prefixed by rejectPod.
	const admitMsg = "Allocate failed due to requested number of devices unavailable for example.com/foo. Requested: 9, Available: 8, which is unexpected"
	if failed.Status.Reason != "UnexpectedAdmissionError" || failed.Status.Message != "Pod was rejected: "+admitMsg {
		t.Errorf("rejected pod: reason %q message %q, want UnexpectedAdmissionError and %q", failed.Status.Reason, failed.Status.Message, "Pod was rejected: "+admitMsg)
	}
	if failed.Status.QOSClass != corev1.PodQOSBestEffort {
		t.Errorf("rejected pod: qosClass %q, want BestEffort kept", failed.Status.QOSClass)
	}
	for _, st := range failed.Status.ContainerStatuses {
		if st.State.Running != nil || st.State.Terminated != nil || st.ContainerID != "" {
			t.Errorf("rejected pod's container %s has run: %+v", st.Name, st)
		}
	}
	ev := waitEvent(t, ctx, c, ns, "too-many", "UnexpectedAdmissionError", admitMsg)
	if ev.Type != corev1.EventTypeWarning || ev.Message != admitMsg {
		t.Errorf("admission event %s %q, want Warning %q", ev.Type, ev.Message, admitMsg)
	}
	if _, err := os.Stat(ran); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the rejected pod's command ran (%s: %v)", ran, err)
	}
	if inUse := fooInUse(n); inUse != 0 {
		t.Errorf("%d example.com/foo in use after the rejection, want 0", inUse)
	}

	// Nothing leaked: a pod bound the same way and asking for every
	// device is admitted and runs with eight distinct devices.
	all := boundPod(devicePod(ns, "all", name, "8", []string{"sh", "-c", "echo devices=$DPKIT_FAKE_DEVICES"}), name)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, all, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if ids := succeededWithDevices(t, ctx, c, ns, "all"); len(ids) != 8 || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != 8 {
		t.Errorf("pod asking for all 8 got devices %v", ids)
	}
	poll(t, ctx, "the devices to be free again", func(context.Context) (bool, string, error) {
		inUse := fooInUse(n)
		return inUse == 0, fmt.Sprintf("in use %d", inUse), nil
	})
}

// TestVirtualNodeExec execs into a running process-backend pod through the
// API server the way kubectl exec does (WebSocket, SPDY as fallback) and
// with SPDY alone: the command sees the pod's devices, stdin reaches it,
// and a non-zero exit code comes back as such.
func TestVirtualNodeExec(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-exec")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-exec")

	runUntilRemoved(t, ctx, c, ns, "exec", name, root, "")
	ids := waitPodDevices(t, ctx, root, ns, "exec", 2)

	for _, mode := range []string{"websocket", "spdy"} {
		t.Run(mode, func(t *testing.T) {
			out, errOut, err := execInPod(ctx, cp.RESTConfig, mode, ns, "exec", []string{"sh", "-c", "echo $DPKIT_FAKE_DEVICES"}, "")
			if err != nil {
				t.Fatalf("exec: %v (stderr %q)", err, errOut)
			}
			got := strings.Split(strings.TrimSpace(out), ",")
			if !slices.Equal(slices.Sorted(slices.Values(got)), ids) {
				t.Errorf("exec sees devices %q, want the pod's %v", out, ids)
			}

			out, _, err = execInPod(ctx, cp.RESTConfig, mode, ns, "exec", []string{"cat"}, "through stdin\n")
			if err != nil || out != "through stdin\n" {
				t.Errorf("exec cat with stdin: %q, %v; want the input back", out, err)
			}

			out, errOut, err = execInPod(ctx, cp.RESTConfig, mode, ns, "exec", []string{"sh", "-c", "echo out; echo oops >&2; exit 3"}, "")
			var ee utilexec.ExitError
			if !errors.As(err, &ee) || ee.ExitStatus() != 3 {
				t.Errorf("exec exiting 3: error %v, want an exit error with code 3", err)
			}
			if out != "out\n" || errOut != "oops\n" {
				t.Errorf("exec exiting 3: stdout %q stderr %q, want out and oops", out, errOut)
			}
		})
	}
}

// TestVirtualNodeStats reads /stats/summary as the API server does (see
// newNodeAccess): the running pod is listed with the CPU time and memory of
// its process.
func TestVirtualNodeStats(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-stats")
	access := newNodeAccess(t, cp)
	_, port := startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, func(o *noderun.Options) { o.NodeIP = access.ip })
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-stats")

	// The shell spends some CPU time of its own before it waits.
	pod := runUntilRemoved(t, ctx, c, ns, "busy", name, root, "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo busy done")
	waitLogs(t, ctx, c, ns, "busy", "busy done")

	var summary statsv1alpha1.Summary
	var ps *statsv1alpha1.PodStats
	poll(t, ctx, "the pod in /stats/summary", func(ctx context.Context) (bool, string, error) {
		b, err := access.get(ctx, c, name, port, "stats/summary")
		if err != nil {
			return false, err.Error(), nil
		}
		summary = statsv1alpha1.Summary{}
		if err := json.Unmarshal(b, &summary); err != nil {
			return false, "", fmt.Errorf("decoding %s: %w", b, err)
		}
		ps = nil
		for i, p := range summary.Pods {
			if p.PodRef.Namespace == ns && p.PodRef.Name == "busy" {
				ps = &summary.Pods[i]
			}
		}
		return ps != nil, string(b), nil
	})
	if summary.Node.NodeName != name {
		t.Errorf("summary of node %q, want %q", summary.Node.NodeName, name)
	}
	if ps.PodRef.UID != string(pod.UID) {
		t.Errorf("pod stats for UID %s, want %s", ps.PodRef.UID, pod.UID)
	}
	if ps.CPU == nil || ps.CPU.UsageCoreNanoSeconds == nil || *ps.CPU.UsageCoreNanoSeconds == 0 {
		t.Errorf("pod CPU %+v, want some CPU time", ps.CPU)
	}
	if ps.Memory == nil || ps.Memory.WorkingSetBytes == nil || *ps.Memory.WorkingSetBytes == 0 {
		t.Errorf("pod memory %+v, want a working set", ps.Memory)
	}
	if len(ps.Containers) != 1 || ps.Containers[0].Name != "app" || ps.Containers[0].CPU == nil || ps.Containers[0].Memory == nil {
		t.Fatalf("container stats %+v, want app with CPU and memory", ps.Containers)
	}
	app := ps.Containers[0]
	if started := pod.Status.ContainerStatuses[0].State.Running.StartedAt; !app.StartTime.Equal(&started) {
		t.Errorf("container start time %v, want its status' %v", app.StartTime, started)
	}
	if *app.CPU.UsageCoreNanoSeconds != *ps.CPU.UsageCoreNanoSeconds || *app.Memory.RSSBytes == 0 {
		t.Errorf("container CPU %d memory %d, pod CPU %d: want the one container's figures", *app.CPU.UsageCoreNanoSeconds, *app.Memory.RSSBytes, *ps.CPU.UsageCoreNanoSeconds)
	}
}

// TestVirtualNodeRestart stops dpkit node while a pod runs and starts it
// again on the same root: the pod is adopted (same process, not restarted,
// not deleted), its devices stay assigned to it, its output is still
// collected, and deleting it then stops the process and frees the devices.
func TestVirtualNodeRestart(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-restart")
	port, access := freePort(t), newNodeAccess(t, cp)
	n, stop := startStoppableNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, access.ip, port)
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-restart")

	ping := filepath.Join(root, "ping")
	before := runUntilRemoved(t, ctx, c, ns, "long", name, root,
		fmt.Sprintf("echo pid=$$$$; while [ ! -e %s ] && [ -e %s ]; do sleep 0.1; done; echo pong", ping, filepath.Join(root, "hold")))
	waitLogs(t, ctx, c, ns, "long", "pid=")
	// The container's process as the host sees it (the shell's $$ is its
	// PID inside the container's PID namespace when the node runs as
	// root): the container ID is process://<host PID>.
	pid, err := strconv.Atoi(strings.TrimPrefix(before.Status.ContainerStatuses[0].ContainerID, "process://"))
	if err != nil {
		t.Fatalf("container ID %q: %v", before.Status.ContainerStatuses[0].ContainerID, err)
	}
	ids := waitPodDevices(t, ctx, root, ns, "long", 2)
	if inUse := fooInUse(n); inUse != 2 {
		t.Fatalf("%d example.com/foo in use, want the pod's 2", inUse)
	}
	wantSame := func(p *corev1.Pod) string {
		st := p.Status.ContainerStatuses
		if p.UID != before.UID || len(st) != 1 || st[0].State.Running == nil {
			return fmt.Sprintf("uid %s (was %s), container statuses %+v", p.UID, before.UID, st)
		}
		was := before.Status.ContainerStatuses[0]
		if st[0].ContainerID != was.ContainerID || !st[0].State.Running.StartedAt.Equal(&was.State.Running.StartedAt) || st[0].RestartCount != 0 {
			return fmt.Sprintf("container %s started %v restarts %d, was %s started %v", st[0].ContainerID, st[0].State.Running.StartedAt, st[0].RestartCount, was.ContainerID, was.State.Running.StartedAt)
		}
		return ""
	}

	stop()
	if !processAlive(pid) {
		t.Fatalf("the pod's process %d ended with dpkit node", pid)
	}
	n, _ = startStoppableNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, access.ip, port)

	// The restarted node serves the adopted pod as it was.
	poll(t, ctx, "the restarted node to list the pod as before", func(ctx context.Context) (bool, string, error) {
		b, err := access.get(ctx, c, name, port, "pods")
		if err != nil {
			return false, err.Error(), nil
		}
		var list corev1.PodList
		if err := json.Unmarshal(b, &list); err != nil {
			return false, "", err
		}
		for _, p := range list.Items {
			if p.Namespace == ns && p.Name == "long" {
				diff := wantSame(&p)
				return diff == "", diff, nil
			}
		}
		return false, "pod not listed", nil
	})
	// Its devices are still its own: the same IDs in PodResources and
	// in use in the device manager once the plugin is back.
	if got := waitPodDevices(t, ctx, root, ns, "long", 2); !slices.Equal(got, ids) {
		t.Errorf("after the restart PodResources lists %v, want %v", got, ids)
	}
	poll(t, ctx, "the plugin back with the pod's 2 devices in use", func(context.Context) (bool, string, error) {
		for _, r := range n.DeviceManager().Resources() {
			if r.Name == string(foo) {
				return r.Connected && r.Allocatable == 8 && r.InUse == 2, fmt.Sprintf("%+v", r), nil
			}
		}
		return false, "example.com/foo unknown", nil
	})
	if !processAlive(pid) {
		t.Fatalf("the pod's process %d ended after the restart", pid)
	}

	// Output written after the restart is collected.
	if err := os.WriteFile(ping, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitLogs(t, ctx, c, ns, "long", "pong")
	p, err := c.CoreV1().Pods(ns).Get(ctx, "long", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
		t.Fatalf("adopted pod: phase %s deletion %v, want Running and not deleted", p.Status.Phase, p.DeletionTimestamp)
	}
	if diff := wantSame(p); diff != "" {
		t.Fatalf("adopted pod in the API server: %s", diff)
	}
	if !processAlive(pid) {
		t.Fatalf("the pod's process %d ended", pid)
	}

	// Deleting it stops the process (SIGTERM), frees the devices and
	// removes its state. The grace period outlasts the test's waits: the
	// pod goes once its process has stopped, as with a kubelet, not when
	// the grace period ends.
	if err := c.CoreV1().Pods(ns).Delete(ctx, "long", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(600))}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the pod to be gone", func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, "long", metav1.GetOptions{})
		if err != nil {
			return apierrors.IsNotFound(err), err.Error(), nil
		}
		return false, fmt.Sprintf("phase %s", p.Status.Phase), nil
	})
	poll(t, ctx, "the pod's process to end, its devices freed and its state removed", func(context.Context) (bool, string, error) {
		_, err := os.Stat(filepath.Join(root, "pods", string(before.UID)))
		alive, inUse := processAlive(pid), fooInUse(n)
		return !alive && inUse == 0 && errors.Is(err, os.ErrNotExist), fmt.Sprintf("process alive %v, in use %d, state %v", alive, inUse, err), nil
	})
}

// TestVirtualNodeSameNameAgain deletes a pod and creates another under the
// same name, twice in a row: each new pod runs with its own devices (the
// node forgets a pod once the API server no longer has it, and never takes
// a new pod for an update of a deleted one of the same name).
func TestVirtualNodeSameNameAgain(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-again")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, name, root, nil)
	startFakePlugin(t, ctx, c, name, root)
	ns := createNamespace(t, c, "vn-again")

	var uids []string
	for round := range 3 {
		marker := fmt.Sprintf("round=%d", round)
		p := runUntilRemoved(t, ctx, c, ns, "again", name, root, "echo "+marker+" devices=$DPKIT_FAKE_DEVICES")
		if slices.Contains(uids, string(p.UID)) {
			t.Fatalf("round %d: pod UID %s seen before", round, p.UID)
		}
		uids = append(uids, string(p.UID))
		if ids := logDevices(t, waitLogs(t, ctx, c, ns, "again", marker)); len(ids) != 2 {
			t.Fatalf("round %d: devices %v, want 2", round, ids)
		}
		if err := c.CoreV1().Pods(ns).Delete(ctx, "again", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		poll(t, ctx, fmt.Sprintf("round %d: the pod to be gone", round), func(ctx context.Context) (bool, string, error) {
			p, err := c.CoreV1().Pods(ns).Get(ctx, "again", metav1.GetOptions{})
			if err != nil {
				return apierrors.IsNotFound(err), err.Error(), nil
			}
			return false, fmt.Sprintf("uid %s phase %s", p.UID, p.Status.Phase), nil
		})
	}
}

// startStoppableNode runs "dpkit node" in-process like startVirtualNode, on
// a given address and port, and returns a function that stops it.
func startStoppableNode(t *testing.T, ctx context.Context, kubeconfig, clientCA, name, root, nodeIP string, port int) (*virtualnode.Node, func()) {
	t.Helper()
	return runNode(t, ctx, nodeOptions(kubeconfig, clientCA, name, root, nodeIP, port))
}

// startFakePlugin runs the fake device plugin (examples/fake.yaml) against
// the node's plugin directory until the test ends, and waits for its 8
// example.com/foo in the node's capacity and allocatable.
func startFakePlugin(t *testing.T, ctx context.Context, c kubernetes.Interface, node, root string) {
	t.Helper()
	startStoppableFakePlugin(t, ctx, c, node, root)
}

// startStoppableFakePlugin is startFakePlugin that also returns what stops
// the plugin and waits until it has.
func startStoppableFakePlugin(t *testing.T, ctx context.Context, c kubernetes.Interface, node, root string) (stop func()) {
	t.Helper()
	stop = runFakePlugin(t, ctx, root)
	poll(t, ctx, "8 example.com/foo in the node's capacity and allocatable", func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		a, ok := n.Status.Allocatable[foo]
		cp, ok2 := n.Status.Capacity[foo]
		return ok && ok2 && a.Value() == 8 && cp.Value() == 8, fmt.Sprintf("capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable), nil
	})
	return stop
}

// runFakePlugin runs the fake device plugin (examples/fake.yaml) against
// root's plugin directory until the test ends or stop is called, which
// waits until it has returned.
func runFakePlugin(t *testing.T, ctx context.Context, root string) (stop func()) {
	t.Helper()
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		var out, logs bytes.Buffer
		done <- app.Run(pctx, []string{"plugin", "--config", filepath.Join("..", "..", "examples", "fake.yaml"), "--plugin-dir", filepath.Join(root, "device-plugins")}, strings.NewReader(""), &out, &logs)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestVirtualNodeAdmissionWait: dpkit node --device-admission-wait,
// restarted while its device plugin is not back yet (a node's reboot, a
// plugin's update). The checkpoint knows example.com/foo, but no plugin
// serves it: a kubelet fails a pod bound to the node and asking for one
// at once (UnexpectedAdmissionError, for good); the node holds it, and it
// runs once the plugin has registered and listed its devices again.
func TestVirtualNodeAdmissionWait(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	root := testdir.Short(t, "vn")
	name := unique("vn-hold")
	o := nodeOptions(cp.Kubeconfig, cp.ClientCAFile, name, root, "127.0.0.1", freePort(t))
	o.DeviceAdmissionWait = 5 * time.Minute
	_, stopNode := runNode(t, ctx, o)
	stopPlugin := startStoppableFakePlugin(t, ctx, c, name, root)
	stopPlugin()
	stopNode()

	n, _ := runNode(t, ctx, o)
	ns := createNamespace(t, c, "vn-hold")
	pod := boundPod(devicePod(ns, "held", name, "1", []string{"sh", "-c", "echo devices=$DPKIT_FAKE_DEVICES"}), name)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, ctx, "the pod's admission held", func(context.Context) (bool, string, error) {
		held := n.DeviceManager().HeldPods()
		return slices.Contains(held, ns+"/held"), fmt.Sprintf("held %v", held), nil
	})
	startFakePlugin(t, ctx, c, name, root)
	if ids := succeededWithDevices(t, ctx, c, ns, "held"); len(ids) != 1 {
		t.Errorf("held pod got devices %v, want 1", ids)
	}
}

// boundPod binds pod to node itself, as a controller or a user may,
// bypassing the scheduler.
func boundPod(pod *corev1.Pod, node string) *corev1.Pod {
	pod.Spec.NodeName = node
	pod.Spec.NodeSelector = nil
	return pod
}

// runUntilRemoved creates a pod asking for two example.com/foo that runs
// script, then waits while root/hold exists, and waits until it runs. The
// test's cleanup removes root/hold (and removing root ends the pod too), so
// no process outlives the test.
func runUntilRemoved(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name, node, root, script string) *corev1.Pod {
	t.Helper()
	hold := filepath.Join(root, "hold")
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(hold) })
	if script == "" {
		script = "true"
	}
	script += fmt.Sprintf("; while [ -e %s ]; do sleep 0.1; done", hold)
	if _, err := c.CoreV1().Pods(ns).Create(ctx, devicePod(ns, name, node, "2", []string{"sh", "-c", script}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitPod(t, ctx, c, ns, name, "Running on "+node, func(p *corev1.Pod) bool {
		return p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning &&
			len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil
	})
}

// waitLogs waits until the pod's logs, read through the API server,
// contain substr, and returns them.
func waitLogs(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, pod, substr string) string {
	t.Helper()
	var logs string
	poll(t, ctx, fmt.Sprintf("%q in the logs of %s/%s", substr, ns, pod), func(ctx context.Context) (bool, string, error) {
		b, err := c.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		logs = string(b)
		return strings.Contains(logs, substr), logs, nil
	})
	return logs
}

// waitPodDevices waits until PodResources on the node under root lists n
// example.com/foo for the pod, and returns their IDs sorted.
func waitPodDevices(t *testing.T, ctx context.Context, root, ns, pod string, n int) []string {
	t.Helper()
	var ids []string
	poll(t, ctx, fmt.Sprintf("PodResources to list %d devices of %s/%s", n, ns, pod), func(ctx context.Context) (bool, string, error) {
		prc, closer, err := prclient.Dial(ctx, podresources.SocketPath(root))
		if err != nil {
			return false, err.Error(), nil
		}
		defer closer.Close()
		resp, err := prc.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			return false, err.Error(), nil
		}
		ids = nil
		for _, p := range resp.PodResources {
			if p.Namespace != ns || p.Name != pod {
				continue
			}
			for _, ctr := range p.Containers {
				for _, d := range ctr.Devices {
					if d.ResourceName == string(foo) {
						ids = append(ids, d.DeviceIds...)
					}
				}
			}
		}
		return len(ids) == n, fmt.Sprintf("%v", resp.PodResources), nil
	})
	slices.Sort(ids)
	return ids
}

// succeededWithDevices waits for the pod to end, fails the test unless it
// succeeded, and returns the devices its logs' devices= line names.
func succeededWithDevices(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string) []string {
	t.Helper()
	done := waitPod(t, ctx, c, ns, name, "Succeeded", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
	if done.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod %s: phase %s reason %q message %q, want Succeeded", name, done.Status.Phase, done.Status.Reason, done.Status.Message)
	}
	b, err := c.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return logDevices(t, string(b))
}

// logDevices returns the IDs of the logs' devices= line.
func logDevices(t *testing.T, logs string) []string {
	t.Helper()
	m := regexp.MustCompile(`devices=(\S+)`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("logs %q: no devices= line", logs)
	}
	return strings.Split(m[1], ",")
}

func fooInUse(n *virtualnode.Node) int64 {
	for _, r := range n.DeviceManager().Resources() {
		if r.Name == string(foo) {
			return r.InUse
		}
	}
	return -1
}

// execInPod runs cmd in the pod's app container through the API server,
// as kubectl exec does: mode "websocket" is kubectl's default (WebSocket,
// falling back to SPDY when the upgrade fails), "spdy" SPDY alone.
func execInPod(ctx context.Context, cfg *rest.Config, mode, ns, pod string, cmd []string, stdin string) (stdout, stderr string, err error) {
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", "", err
	}
	req := c.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "app", Command: cmd, Stdin: stdin != "", Stdout: true, Stderr: true}, scheme.ParameterCodec)
	exec, err := remotecommand.NewSPDYExecutor(cfg, "POST", req.URL())
	if err != nil {
		return "", "", err
	}
	if mode == "websocket" {
		ws, err := remotecommand.NewWebSocketExecutor(cfg, "GET", req.URL().String())
		if err != nil {
			return "", "", err
		}
		exec, err = remotecommand.NewFallbackExecutor(ws, exec, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
		if err != nil {
			return "", "", err
		}
	}
	var out, errOut bytes.Buffer
	opts := remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}
	if stdin != "" {
		opts.Stdin = strings.NewReader(stdin)
	}
	err = exec.StreamWithContext(ctx, opts)
	return out.String(), errOut.String(), err
}

// nodeAccess reaches a virtual node's API the way the API server does.
// The API server's node proxy (nodes/NAME/proxy/...) refuses loopback and
// link-local node addresses, so on a machine with another IPv4 address the
// node is given that one and requests go through the proxy. On a machine
// without one the node keeps 127.0.0.1 and the test calls it directly with
// the API server's own kubelet-client identity: the same TLS, the same
// webhook authentication and authorization, without the proxy hop.
type nodeAccess struct {
	ip     string
	direct *http.Client // nil: through the API server's node proxy
}

func newNodeAccess(t *testing.T, cp *controlplane.ControlPlane) *nodeAccess {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return &nodeAccess{ip: n.IP.String()}
		}
	}
	t.Logf("no IPv4 address other than loopback or link-local among %v: calling the node directly, not through the API server's node proxy", addrs)
	certFile, keyFile, err := cp.IssueClientCert("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// Like the API server, which is not given the node's serving CA.
	tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}} //nolint:gosec // as the API server
	t.Cleanup(tr.CloseIdleConnections)
	return &nodeAccess{ip: "127.0.0.1", direct: &http.Client{Transport: tr}}
}

// get returns the body of GET path (e.g. "stats/summary") on node name.
func (a *nodeAccess) get(ctx context.Context, c kubernetes.Interface, name string, port int, path string) ([]byte, error) {
	if a.direct == nil {
		return c.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", name, "proxy", path).DoRaw(ctx)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s/%s", net.JoinHostPort(a.ip, strconv.Itoa(port)), path), nil)
	if err != nil {
		return nil, err
	}
	resp, err := a.direct.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b, err
}

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] != 'Z' && s[i+2] != 'X'
}
