package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	utilexec "k8s.io/client-go/util/exec"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
	"github.com/dpkit/dpkit/pkg/virtualnode"
	"github.com/dpkit/dpkit/test/controlplane"
)

// sbsSide is one of the two nodes TestRealNodeSideBySide runs its pods on.
type sbsSide struct {
	label  string // in the table
	prefix string // of the pods' names
	node   string
	socket string // its PodResources socket
}

// sbsRow is what the test saw of one pod on one side.
type sbsRow struct {
	pod         string
	devices     int    // listed by the node's PodResources while it ran
	env         string // the plugin's variable as the container printed it
	deviceNode  string // whether the container had /dev/dpkit-zero
	logs        string // the pod's log through the API server, device node line left out
	exec        string // stdout of an exec through the API server, and its exit code
	phase       corev1.PodPhase
	reason      string // the container's terminated reason
	exitCode    int32
	status      string // pod conditions and container status flags at the end
	schedReason string // for the pod asking for one too many
}

// TestRealNodeSideBySide runs the same pods on the real node (kubelet +
// containerd, the generic plugin deployed as a DaemonSet from the
// kustomize overlay with the lean image) and on a `dpkit node` with the
// process backend registered with the same control plane (the same plugin
// config run as `dpkit plugin` against the node's root), and compares,
// pod by pod: the devices PodResources lists, the plugin's env in the
// container read back through the pod log endpoint, an exec through the
// API server (output and exit code), the pod's phase, reason and exit code
// at the end (exit 0 Succeeded, exit 1 Failed), and the scheduler's reason
// for a pod asking for one device more than the node has. The only
// difference allowed is the one a host process cannot have: the device
// node the plugin asks for (docs/virtual-node.md, "Side by side with a
// real node").
func TestRealNodeSideBySide(t *testing.T) {
	cp, n := realNode.Get(t)
	importPluginImage(t, n) // before the test's deadline starts: a cold build takes minutes
	ctx := testContext(t)
	c := cp.Client()

	const res = corev1.ResourceName("e2e.dpkit.io/zero-sbs")
	config := zeroConfig(string(res))
	// The DaemonSet tolerates every taint; kept to the real node, it
	// leaves the dpkit node to the plugin run as a process.
	patch := `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: dpkit-plugin
spec:
  template:
    spec:
      nodeSelector:
        kubernetes.io/hostname: ` + n.Name + `
`
	d := deployOverlay(t, "generic", string(res), config, patch)
	d.apply(t, ctx, cp)
	d.waitPluginReady(t, ctx, c, n.Name, "2")

	root := testdir.Short(t, "vn")
	vn := unique("sbs")
	startVirtualNode(t, ctx, cp.Kubeconfig, cp.ClientCAFile, vn, root, nil)
	cfg := filepath.Join(root, "plugin.yaml")
	writeFile(t, cfg, "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n- generic:\n"+indent(config, "    "))
	pctx, cancel := context.WithCancel(ctx)
	pluginDone := make(chan error, 1)
	var pluginLogs bytes.Buffer
	go func() {
		var out bytes.Buffer
		pluginDone <- app.Run(pctx, []string{"plugin", "--config", cfg, "--plugin-dir", filepath.Join(root, "device-plugins")}, strings.NewReader(""), &out, &pluginLogs)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-pluginDone; err != nil {
			t.Errorf("dpkit plugin: %v\n%s", err, pluginLogs.String())
		}
	})
	waitAllocatable(t, ctx, c, vn, res, "2")

	ns := createNamespace(t, c, "sbs")
	sides := []sbsSide{
		{"real node", "real", n.Name, podresources.SocketPath(n.KubeletRoot)},
		{"dpkit node", "dpkit", vn, podresources.SocketPath(root)},
	}
	rows := make([][]sbsRow, len(sides))
	for i, s := range sides {
		rows[i] = sbsRun(t, ctx, cp, c, ns, s, res)
	}
	sbsTable(t, sides, rows)

	onReal, onDpkit := rows[0], rows[1]
	for k := range onReal {
		r, v := onReal[k], onDpkit[k]
		name := strings.TrimPrefix(r.pod, "real-")
		for _, f := range []struct {
			what        string
			onReal, got any
		}{
			{"devices in PodResources", r.devices, v.devices},
			{"the plugin's env in the container", r.env, v.env},
			{"log", r.logs, v.logs},
			{"exec", r.exec, v.exec},
			{"phase", r.phase, v.phase},
			{"reason", r.reason, v.reason},
			{"exit code", r.exitCode, v.exitCode},
			{"pod conditions and container status", r.status, v.status},
			{"scheduler's reason", r.schedReason, v.schedReason},
		} {
			if f.onReal != f.got {
				t.Errorf("pod %s: %s on the dpkit node %q, on the real node %q", name, f.what, f.got, f.onReal)
			}
		}
		// What a host process cannot have (documented): the device node.
		if r.deviceNode != v.deviceNode && (r.deviceNode != "present" || v.deviceNode != "absent") {
			t.Errorf("pod %s: device node %q on the real node, %q on the dpkit node; want present and absent (docs/virtual-node.md)", name, r.deviceNode, v.deviceNode)
		}
	}
	// The table must say something: each side as it should be on its own.
	for i, want := range []sbsRow{
		{devices: 1, env: "from the plugin", deviceNode: "present", exec: "exec DPKIT_E2E=from the plugin; exit 3", phase: corev1.PodSucceeded, reason: "Completed", exitCode: 0},
		{devices: 1, env: "from the plugin", deviceNode: "present", exec: "exec DPKIT_E2E=from the plugin; exit 3", phase: corev1.PodFailed, reason: "Error", exitCode: 1},
		{phase: corev1.PodPending},
	} {
		got := onReal[i]
		if got.devices != want.devices || got.env != want.env || got.deviceNode != want.deviceNode || got.exec != want.exec || got.phase != want.phase || got.reason != want.reason || got.exitCode != want.exitCode {
			t.Errorf("real node, pod %s: %+v, want %+v", got.pod, got, want)
		}
	}
	if !strings.Contains(onReal[2].schedReason, "Insufficient "+string(res)) {
		t.Errorf("real node, pod asking for one too many: scheduler's reason %q, want Insufficient %s", onReal[2].schedReason, res)
	}
}

// sbsRun runs the pod set on one side: "ok" (one device, exits 0) and
// "fail" (one device, exits 1) side by side, each held until an exec
// releases it, then "too-many" (3 of the 2 devices).
func sbsRun(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, c kubernetes.Interface, ns string, s sbsSide, res corev1.ResourceName) []sbsRow {
	t.Helper()
	var rows []sbsRow
	for _, p := range []struct {
		name string
		exit int
	}{{"ok", 0}, {"fail", 1}} {
		name := s.prefix + "-" + p.name
		sbsCreate(t, ctx, c, sbsPod(ns, name, s.node, res, "1", p.exit))
		waitPod(t, ctx, c, ns, name, "running on "+s.node, func(p *corev1.Pod) bool { return p.Spec.NodeName == s.node && p.Status.Phase == corev1.PodRunning })
		rows = append(rows, sbsRow{pod: name})
	}
	for i := range rows {
		r := &rows[i]
		poll(t, ctx, "PodResources of "+s.label+" to list "+r.pod+"'s device", func(ctx context.Context) (bool, string, error) {
			ids, err := podDevicesAt(ctx, s.socket, ns, r.pod)
			if err != nil {
				return false, err.Error(), nil
			}
			r.devices = len(ids)
			return len(ids) > 0, fmt.Sprint(ids), nil
		})
		poll(t, ctx, "the log of "+r.pod, func(ctx context.Context) (bool, string, error) {
			b, err := c.CoreV1().Pods(ns).GetLogs(r.pod, &corev1.PodLogOptions{}).DoRaw(ctx)
			if err != nil {
				return false, err.Error(), nil
			}
			return strings.Contains(string(b), "device node: "), string(b), nil
		})
		out, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, r.pod, []string{"sh", "-c", `echo "exec DPKIT_E2E=$DPKIT_E2E"; exit 3`}, "")
		var ee utilexec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s: exec in %s: %v (stderr %q), want exit code 3", s.label, r.pod, err, errOut)
		}
		r.exec = fmt.Sprintf("%s; exit %d", strings.TrimSpace(out), ee.ExitStatus())
		// The container ends as soon as release exists, and may end
		// before the runtime reported the exec's exit: the exec then
		// reads as killed (137). The pod's end is what the test checks.
		if _, errOut, err := execInPod(ctx, cp.RESTConfig, "websocket", ns, r.pod, []string{"touch", "release"}, ""); err != nil && (!errors.As(err, &ee) || ee.ExitStatus() != 137) {
			t.Fatalf("%s: exec touch release in %s: %v (stderr %q)", s.label, r.pod, err, errOut)
		}
	}
	for i := range rows {
		r := &rows[i]
		p := waitPod(t, ctx, c, ns, r.pod, "ended", func(p *corev1.Pod) bool {
			return (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) &&
				len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Terminated != nil
		})
		term := p.Status.ContainerStatuses[0].State.Terminated
		r.phase, r.reason, r.exitCode = p.Status.Phase, term.Reason, term.ExitCode
		r.status = sbsStatus(p)
		b, err := c.CoreV1().Pods(ns).GetLogs(r.pod, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatalf("%s: the log of %s through the API server: %v", s.label, r.pod, err)
		}
		var kept []string
		for _, line := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(line, "DPKIT_E2E="):
				r.env = strings.TrimPrefix(line, "DPKIT_E2E=")
			case strings.HasPrefix(line, "device node: "):
				r.deviceNode = strings.TrimPrefix(line, "device node: ")
				continue
			}
			kept = append(kept, line)
		}
		r.logs = strings.Join(kept, "\n")
	}

	name := s.prefix + "-too-many"
	sbsCreate(t, ctx, c, sbsPod(ns, name, s.node, res, "3", 0))
	ev := waitEvent(t, ctx, c, ns, name, "FailedScheduling", "Insufficient "+string(res))
	p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Errorf("%s: %s asking for 3 was bound to %s", s.label, name, p.Spec.NodeName)
	}
	return append(rows, sbsRow{pod: name, phase: p.Status.Phase, schedReason: ev.Reason + ": " + ev.Message})
}

// sbsPod asks for amount of res on node; it prints the plugin's env and
// whether the device node is there, waits until the file release appears
// in its working directory (an exec creates it), and exits with exit.
func sbsPod(ns, name, node string, res corev1.ResourceName, amount string, exit int) *corev1.Pod {
	script := `echo "DPKIT_E2E=$DPKIT_E2E"
if [ -c /dev/dpkit-zero ]; then echo "device node: present"; else echo "device node: absent"; fi
while [ ! -e release ]; do sleep 0.1; done
echo released
exit ` + fmt.Sprint(exit)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64),
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": node},
			Tolerations:                   []corev1.Toleration{{Key: virtualnode.DefaultTaintKey, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{
				Name: "app", Image: controlplane.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:   []string{"sh", "-c", script},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse(amount)}},
			}},
		},
	}
}

func sbsCreate(t *testing.T, ctx context.Context, c kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	if _, err := c.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			describePod(t, c, pod.Namespace, pod.Name)
		}
		zero := int64(0)
		_ = c.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	})
}

// podDevicesAt returns the device IDs the PodResources API at socket
// lists for a pod.
func podDevicesAt(ctx context.Context, socket, ns, name string) ([]string, error) {
	client, closer, err := prclient.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	resp, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() == ns && p.GetName() == name {
			for _, c := range p.GetContainers() {
				for _, d := range c.GetDevices() {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	return ids, nil
}

// sbsTable logs the two sides, a row per pod and side.
func sbsTable(t *testing.T, sides []sbsSide, rows [][]sbsRow) {
	t.Helper()
	var b bytes.Buffer
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "POD\tNODE\tDEVICES\tDPKIT_E2E\tDEVICE NODE\tEXEC\tPHASE\tREASON\tEXIT\tSCHEDULER")
	for k := range rows[0] {
		for i, s := range sides {
			r := rows[i][k]
			name := strings.TrimPrefix(r.pod, s.prefix+"-")
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", name, s.label, r.devices, dash(r.env), dash(r.deviceNode), dash(r.exec), r.phase, dash(r.reason), r.exitCode, dash(firstSentence(r.schedReason)))
		}
	}
	_ = w.Flush()
	t.Logf("side by side:\n%s", b.String())
	for k := range rows[0] {
		for i, s := range sides {
			if r := rows[i][k]; r.status != "" {
				t.Logf("%s on the %s: %s", r.pod, s.label, r.status)
			}
		}
	}
}

// sbsStatus sums up a pod's conditions (type, status, reason, observed
// generation) and its container's ready and started flags and whether its
// terminated state names the container, in a stable order.
// PodReadyToStartContainers is left out: it is the state of the pod's
// sandbox, which a host process does not have (documented).
func sbsStatus(p *corev1.Pod) string {
	var conds []string
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers {
			continue
		}
		conds = append(conds, fmt.Sprintf("%s=%s/%s@%d", c.Type, c.Status, c.Reason, c.ObservedGeneration))
	}
	sort.Strings(conds)
	cs := p.Status.ContainerStatuses[0]
	named := cs.State.Terminated != nil && cs.State.Terminated.ContainerID == cs.ContainerID && cs.ContainerID != ""
	return fmt.Sprintf("%s; generation %d; ready=%v started=%v terminated names the container=%v", strings.Join(conds, " "), p.Status.ObservedGeneration, cs.Ready, cs.Started != nil && *cs.Started, named)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func firstSentence(s string) string {
	before, _, _ := strings.Cut(s, ". ")
	return before
}
