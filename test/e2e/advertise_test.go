package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/cli/app"
	clusterapp "github.com/dpkit/dpkit/internal/cli/app/cluster"
	"github.com/dpkit/dpkit/pkg/extresource"
	"github.com/dpkit/dpkit/test/controlplane"
)

const (
	dongle = corev1.ResourceName("example.com/dongle")
	widget = corev1.ResourceName("example.com/widget")
	// waitTimeout bounds every wait on the control plane.
	waitTimeout = time.Minute
)

// TestAdvertiseSchedulesPods advertises example.com/dongle=4 with the dpkit
// command and checks what the real kube-scheduler does with it.
func TestAdvertiseSchedulesPods(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	node := createNode(t, c, "adv-sched")
	ns := createNamespace(t, c, "adv-sched")

	out := runDpkit(t, ctx, 0, "advertise", "--kubeconfig", cp.Kubeconfig, "--node", node, "example.com/dongle=4")
	if want := "node/" + node + ": set example.com/dongle=4"; !strings.Contains(out, want) {
		t.Fatalf("dpkit advertise printed %q, want %q", out, want)
	}
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantAmount(t, n, dongle, "4")

	fits := createPod(t, c, ns, "fits", dongle, "2")
	bound := waitPod(t, ctx, c, ns, fits, "bound", func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	if bound.Spec.NodeName != node {
		t.Fatalf("pod asking for 2 dongles bound to %q, want %q", bound.Spec.NodeName, node)
	}

	tooMany := createPod(t, c, ns, "too-many", dongle, "5")
	ev := waitEvent(t, ctx, c, ns, tooMany, "FailedScheduling", "Insufficient example.com/dongle")
	t.Logf("event: %s", ev.Message)
	p, err := c.CoreV1().Pods(ns).Get(ctx, tooMany, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod asking for 5 dongles: node %q, phase %s; want unbound and Pending", p.Spec.NodeName, p.Status.Phase)
	}
}

// TestAdvertiseCommand runs the one-shot command in-process: dry run,
// apply, idempotence and removal without a trace.
func TestAdvertiseCommand(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	node := createNode(t, c, "adv-cmd")
	base := []string{"advertise", "--kubeconfig", cp.Kubeconfig, "--node", node}
	args := func(more ...string) []string { return append(append([]string(nil), base...), more...) }

	out := runDpkit(t, ctx, 0, args("example.com/dongle=4", "--dry-run")...)
	for _, want := range []string{`"path": "/status/capacity/example.com~1dongle"`, `"path": "/status/allocatable/example.com~1dongle"`, `"value": "4"`} {
		if !strings.Contains(out, want) {
			t.Errorf("--dry-run printed\n%s\nwant it to contain %s", out, want)
		}
	}
	n := getNode(t, ctx, c, node)
	if _, ok := n.Status.Capacity[dongle]; ok {
		t.Fatalf("--dry-run changed the node: capacity %v", n.Status.Capacity)
	}

	steps := []struct {
		name string
		args []string
		want string
		has  map[corev1.ResourceName]string
	}{
		{"set", args("example.com/dongle=4", "example.com/widget=2"), "node/" + node + ": set example.com/dongle=4\nnode/" + node + ": set example.com/widget=2\n",
			map[corev1.ResourceName]string{dongle: "4", widget: "2"}},
		{"again is a no-op", args("example.com/dongle=4", "example.com/widget=2"), "node/" + node + ": unchanged\n",
			map[corev1.ResourceName]string{dongle: "4", widget: "2"}},
		{"change one", args("example.com/dongle=6"), "node/" + node + ": set example.com/dongle=6\n",
			map[corev1.ResourceName]string{dongle: "6", widget: "2"}},
		{"remove", args("--remove", "example.com/dongle", "--remove", "example.com/widget"), "node/" + node + ": removed example.com/dongle\nnode/" + node + ": removed example.com/widget\n",
			map[corev1.ResourceName]string{}},
		{"remove again is a no-op", args("--remove", "example.com/dongle"), "node/" + node + ": unchanged\n",
			map[corev1.ResourceName]string{}},
	}
	for _, s := range steps {
		out := runDpkit(t, ctx, 0, s.args...)
		if out != s.want {
			t.Errorf("%s: printed %q, want %q", s.name, out, s.want)
		}
		n := getNode(t, ctx, c, node)
		for _, name := range []corev1.ResourceName{dongle, widget} {
			want, ok := s.has[name]
			if !ok {
				wantAbsent(t, n, name)
				continue
			}
			wantAmount(t, n, name, want)
		}
	}
	// The node's own resources are untouched.
	n = getNode(t, ctx, c, node)
	wantAmount(t, n, corev1.ResourceCPU, "4")

	// -o json says what was done, for scripts.
	out = runDpkit(t, ctx, 0, args("example.com/dongle=3", "-o", "json")...)
	var res struct {
		Node    string            `json:"node"`
		Changed bool              `json:"changed"`
		Set     map[string]string `json:"set"`
		Removed []string          `json:"removed"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("-o json printed %q: %v", out, err)
	}
	if res.Node != node || !res.Changed || len(res.Set) != 1 || res.Set["example.com/dongle"] != "3" || len(res.Removed) != 0 {
		t.Errorf("-o json printed %+v, want dongle set to 3 on %s", res, node)
	}
	out = runDpkit(t, ctx, 0, args("--remove", "example.com/dongle", "-o", "yaml")...)
	if want := "changed: true\nnode: " + node + "\nremoved:\n- example.com/dongle\nset: {}\n"; out != want {
		t.Errorf("-o yaml printed %q, want %q", out, want)
	}

	out = runDpkit(t, ctx, 2, args("kubernetes.io/dongle=1")...)
	if !strings.Contains(out, "reserved") {
		t.Errorf("reserved name: printed %q, want the reason", out)
	}
	_ = runDpkit(t, ctx, 1, "advertise", "--kubeconfig", cp.Kubeconfig, "--node", "no-such-node", "example.com/dongle=1")
}

// TestAdvertiseController runs the controller as an identity holding only
// the ClusterRole of deploy/advertise and checks that it restores resources
// dropped behind its back, follows its file and cleans up on exit.
func TestAdvertiseController(t *testing.T) {
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	node := createNode(t, c, "adv-ctrl")
	user := bindDeployedRole(t, ctx, cp, unique("dpkit-advertise-e2e"))
	cfg, err := cp.RESTConfigFor(user)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 5, 10
	limited := kubernetes.NewForConfigOrDie(cfg)

	// The role allows status patches only.
	_, err = limited.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("patching the node object with the advertise role: err = %v, want Forbidden", err)
	}

	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/dongle\n  quantity: 3\n- name: example.com/widget\n")
	ctrl, err := extresource.NewController(extresource.ControllerConfig{
		Client: limited, NodeName: node, File: file, RemoveOnExit: true, Logger: testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	waitNode(t, ctx, c, node, "advertised from the file", map[corev1.ResourceName]string{dongle: "3", widget: "1"})

	// Another writer drops widget: the controller puts it back.
	patch := fmt.Sprintf(`[{"op":"remove","path":"/status/capacity/%[1]s"},{"op":"remove","path":"/status/allocatable/%[1]s"}]`,
		extresource.EscapePointer(string(widget)))
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	waitNode(t, ctx, c, node, "restored after removal behind its back", map[corev1.ResourceName]string{dongle: "3", widget: "1"})

	// Another writer changes the amount: the controller sets it back.
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.JSONPatchType,
		[]byte(`[{"op":"replace","path":"/status/capacity/example.com~1dongle","value":"9"}]`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	waitNode(t, ctx, c, node, "restored after a change behind its back", map[corev1.ResourceName]string{dongle: "3", widget: "1"})

	// The file changes as an editor saves it (write aside, rename over).
	writeFile(t, file, "apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/widget\n  quantity: 2\n")
	waitNode(t, ctx, c, node, "updated from the changed file", map[corev1.ResourceName]string{widget: "2"})

	stop()
	select {
	case err := <-done:
		done <- err // for the cleanup
		if err != nil {
			t.Fatalf("controller ended with %v", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("controller did not stop within a minute of its context ending")
	}
	n := getNode(t, ctx, c, node)
	wantAbsent(t, n, dongle)
	wantAbsent(t, n, widget)
}

// TestAdvertiseControllerProcess runs the built dpkit binary as the
// DaemonSet does, with the resources of deploy/advertise/configmap.yaml, and
// stops it with SIGTERM.
func TestAdvertiseControllerProcess(t *testing.T) {
	bin := dpkitBinary(t) // before the test's deadline starts: a cold build takes minutes
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	node := createNode(t, c, "adv-proc")

	var cm corev1.ConfigMap
	readManifest(t, "configmap.yaml", &cm)
	file := filepath.Join(t.TempDir(), "resources.yaml")
	writeFile(t, file, cm.Data["resources.yaml"])

	var logs bytes.Buffer
	cmd := exec.Command(bin, "advertise", "--kubeconfig", cp.Kubeconfig, "--file", file, "--watch", "--remove-on-exit", "--log-level=debug")
	cmd.Env = append(os.Environ(), "NODE_NAME="+node)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("dpkit advertise output:\n%s", logs.String())
		}
	})

	waitNode(t, ctx, c, node, "advertised by the process", map[corev1.ResourceName]string{dongle: "4"})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("dpkit advertise exited with %v after SIGTERM", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("dpkit advertise did not exit within a minute of SIGTERM")
	}
	n := getNode(t, ctx, c, node)
	wantAbsent(t, n, dongle)
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// runDpkit runs the dpkit command line in-process and checks its exit code;
// it returns what it printed on its output, then the error if any. Logs
// (its error stream) are shown only when the exit code is not the one
// wanted.
func runDpkit(t *testing.T, ctx context.Context, wantCode int, args ...string) string {
	t.Helper()
	var out, logs bytes.Buffer
	err := clusterapp.Run(ctx, args, strings.NewReader(""), &out, &logs)
	if err != nil {
		fmt.Fprintln(&out, "error:", err)
	}
	if code := app.ExitCode(err); code != wantCode {
		t.Fatalf("dpkit %s: exit code %d, want %d; output:\n%s\nlogs:\n%s", strings.Join(args, " "), code, wantCode, out.String(), logs.String())
	}
	return out.String()
}

// unique returns base with a suffix unique in this test process, so tests
// run again (-count) on the shared control plane do not collide with the
// objects of earlier runs (namespaces are never deleted for good: nothing
// finalizes them without kube-controller-manager).
func unique(base string) string {
	return fmt.Sprintf("%s-%d", base, nameSeq.Add(1))
}

var nameSeq atomic.Int64

// createNode creates a schedulable node named unique(base) and returns its
// name.
func createNode(t *testing.T, c kubernetes.Interface, base string) string {
	t.Helper()
	name := unique(base)
	list := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("4"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{
			Capacity:    list,
			Allocatable: list.DeepCopy(),
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "E2E", LastHeartbeatTime: metav1.Now()}},
		},
	}
	ctx := context.Background()
	created, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	// The apiserver taints new nodes not-ready (TaintNodesByCondition);
	// with no node lifecycle controller to lift it, the test does.
	if len(created.Spec.Taints) > 0 {
		created.Spec.Taints = nil
		if _, err := c.CoreV1().Nodes().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("untaint node %s: %v", name, err)
		}
	}
	t.Cleanup(func() {
		if err := c.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete node %s: %v", name, err)
		}
	})
	return name
}

func createNamespace(t *testing.T, c kubernetes.Interface, base string) string {
	t.Helper()
	name := unique(base)
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// createPod creates a pod that asks for amount of an extended resource
// (a limit, which is also its request).
func createPod(t *testing.T, c kubernetes.Interface, ns, name string, res corev1.ResourceName, amount string) string {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name:      "app",
				Image:     "registry.invalid/app:never-pulled",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{res: resource.MustParse(amount)}},
			}},
		},
	}
	if _, err := c.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s/%s: %v", ns, name, err)
	}
	return name
}

func getNode(t *testing.T, ctx context.Context, c kubernetes.Interface, name string) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// poll calls cond every 100ms until it is true, failing the test after
// waitTimeout with what it was waiting for and the last state seen.
func poll(t testing.TB, ctx context.Context, what string, cond func(context.Context) (bool, string, error)) {
	t.Helper()
	if err := pollUntil(ctx, what, cond); err != nil {
		t.Fatal(err)
	}
}

// pollUntil is poll returning its failure: what it waited for and the last
// state seen. A call that fails (the last one does when the deadline cuts
// its request short) keeps the state an earlier call saw.
func pollUntil(ctx context.Context, what string, cond func(context.Context) (bool, string, error)) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, waitTimeout, true, func(ctx context.Context) (bool, error) {
		ok, state, err := cond(ctx)
		if err == nil || state != "" {
			last = state
		}
		return ok, err
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w; last seen: %s", what, err, last)
	}
	return nil
}

// waitPod polls the pod until cond holds. Its failure says what the pod
// last looked like and the warnings recorded on it (a kubelet's failed
// prepare, mount or sandbox), so that the first line of a failed run
// says why.
func waitPod(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := pollUntil(ctx, "pod "+ns+"/"+name+" "+what, func(ctx context.Context) (bool, string, error) {
		p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		pod = p
		return cond(p), podState(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s warnings: %s; %v", ns, name, podWarnings(c, ns, name), err)
	}
	return pod
}

// podState is a pod's status in a line: node, phase, the conditions that
// do not hold and why, and each container's state.
func podState(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node %q phase %s", p.Spec.NodeName, p.Status.Phase)
	if p.Status.Reason != "" {
		fmt.Fprintf(&b, " (%s: %s)", p.Status.Reason, p.Status.Message)
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			fmt.Fprintf(&b, "; %s %s", c.Type, c.Status)
			if c.Reason != "" || c.Message != "" {
				fmt.Fprintf(&b, " (%s: %s)", c.Reason, c.Message)
			}
		}
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		switch st := cs.State; {
		case st.Waiting != nil:
			fmt.Fprintf(&b, "; container %s waiting (%s: %s)", cs.Name, st.Waiting.Reason, st.Waiting.Message)
		case st.Terminated != nil:
			fmt.Fprintf(&b, "; container %s terminated (%s, exit %d: %s)", cs.Name, st.Terminated.Reason, st.Terminated.ExitCode, st.Terminated.Message)
		case st.Running != nil:
			fmt.Fprintf(&b, "; container %s running", cs.Name)
		}
	}
	return b.String()
}

// podWarnings lists the Warning events recorded on a pod, oldest first,
// each with its count: "none" when there are none.
func podWarnings(c kubernetes.Interface, ns, name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sel := fields.Set{"involvedObject.name": name, "type": corev1.EventTypeWarning}.AsSelector().String()
	evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return "(listing them failed: " + err.Error() + ")"
	}
	// The kubelet's events carry lastTimestamp and count; the
	// scheduler's (events.k8s.io) eventTime and a series.
	last := func(e corev1.Event) time.Time {
		switch {
		case e.Series != nil:
			return e.Series.LastObservedTime.Time
		case !e.LastTimestamp.IsZero():
			return e.LastTimestamp.Time
		}
		return e.EventTime.Time
	}
	count := func(e corev1.Event) int32 {
		if e.Series != nil {
			return e.Series.Count
		}
		return max(e.Count, 1)
	}
	sort.SliceStable(evs.Items, func(i, j int) bool { return last(evs.Items[i]).Before(last(evs.Items[j])) })
	var out []string
	for _, e := range evs.Items {
		from := e.Source.Component
		if from == "" {
			from = e.ReportingController
		}
		out = append(out, fmt.Sprintf("%s (%s) x%d, last at %s: %s", e.Reason, from, count(e), last(e).UTC().Format(time.TimeOnly), e.Message))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " | ")
}

func waitEvent(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, pod, reason, substr string) corev1.Event {
	t.Helper()
	var found corev1.Event
	sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod, "reason": reason}.AsSelector().String()
	poll(t, ctx, fmt.Sprintf("a %s event on pod %s/%s containing %q", reason, ns, pod, substr), func(ctx context.Context) (bool, string, error) {
		evs, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, "", err
		}
		var msgs []string
		for _, e := range evs.Items {
			if strings.Contains(e.Message, substr) {
				found = e
				return true, "", nil
			}
			msgs = append(msgs, e.Message)
		}
		return false, fmt.Sprintf("%q", msgs), nil
	})
	return found
}

// waitNode waits until the node's capacity and allocatable hold exactly
// want among the test's extended resources.
func waitNode(t *testing.T, ctx context.Context, c kubernetes.Interface, node, what string, want map[corev1.ResourceName]string) {
	t.Helper()
	poll(t, ctx, "node "+node+" "+what, func(ctx context.Context) (bool, string, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		state := fmt.Sprintf("capacity %v allocatable %v", n.Status.Capacity, n.Status.Allocatable)
		for _, name := range []corev1.ResourceName{dongle, widget} {
			for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
				have, ok := l[name]
				w, wanted := want[name]
				if ok != wanted || (ok && have.Cmp(resource.MustParse(w)) != 0) {
					return false, state, nil
				}
			}
		}
		return true, state, nil
	})
}

func wantAmount(t *testing.T, n *corev1.Node, name corev1.ResourceName, amount string) {
	t.Helper()
	for field, l := range map[string]corev1.ResourceList{"capacity": n.Status.Capacity, "allocatable": n.Status.Allocatable} {
		have, ok := l[name]
		if !ok || have.Cmp(resource.MustParse(amount)) != 0 {
			t.Errorf("node %s %s[%s] = %v (present %v), want %s", n.Name, field, name, have.String(), ok, amount)
		}
	}
}

func wantAbsent(t *testing.T, n *corev1.Node, name corev1.ResourceName) {
	t.Helper()
	for field, l := range map[string]corev1.ResourceList{"capacity": n.Status.Capacity, "allocatable": n.Status.Allocatable} {
		if q, ok := l[name]; ok {
			t.Errorf("node %s still has %s[%s] = %s", n.Name, field, name, q.String())
		}
	}
}

// writeFile replaces path the way editors do: write a sibling, rename it
// over.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// readManifest decodes one object of deploy/advertise/name; for a file of
// several documents, into's kind picks the document.
func readManifest(t *testing.T, name string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "advertise", name))
	if err != nil {
		t.Fatal(err)
	}
	var want metav1.TypeMeta
	switch into.(type) {
	case *rbacv1.ClusterRole:
		want.Kind = "ClusterRole"
	case *rbacv1.ClusterRoleBinding:
		want.Kind = "ClusterRoleBinding"
	}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want.Kind != "" && tm.Kind != want.Kind {
			continue
		}
		if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return
	}
	t.Fatalf("%s has no %s", name, want.Kind)
}

// bindDeployedRole creates the ClusterRole of deploy/advertise/rbac.yaml and
// binds it to a user, returned for KubeconfigFor.
func bindDeployedRole(t *testing.T, ctx context.Context, cp *controlplane.ControlPlane, user string) string {
	t.Helper()
	var role rbacv1.ClusterRole
	readManifest(t, "rbac.yaml", &role)
	var binding rbacv1.ClusterRoleBinding
	readManifest(t, "rbac.yaml", &binding)
	if binding.RoleRef.Name != role.Name {
		t.Fatalf("rbac.yaml binds %q, not its ClusterRole %q", binding.RoleRef.Name, role.Name)
	}
	c := cp.Client()
	role.Name += "-" + user
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding.Name = role.Name
	binding.RoleRef.Name = role.Name
	binding.Subjects = []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// RBAC is enforced from the authorizer's cache: wait until it allows.
	cfg, err := cp.RESTConfigFor(user)
	if err != nil {
		t.Fatal(err)
	}
	uc := kubernetes.NewForConfigOrDie(cfg)
	poll(t, ctx, "RBAC to allow "+user+" to list nodes", func(ctx context.Context) (bool, string, error) {
		_, err := uc.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		if apierrors.IsForbidden(err) {
			return false, err.Error(), nil
		}
		return err == nil, "", err
	})
	return user
}

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// dpkitBinary builds cmd/dpkit once per test run, with cmd/dpkit-cluster
// next to it (dpkit runs dpkit-cluster for node, advertise and get
// --kubeconfig, as it does when installed) and cmd/dpkit-fakedra, as `make
// build` does.
func dpkitBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "dpkit-e2e-bin")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "dpkit")
		cmd := exec.Command("go", "build", "-o", binDir+string(filepath.Separator), "./cmd/dpkit", "./cmd/dpkit-cluster", "./cmd/dpkit-fakedra")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/dpkit ./cmd/dpkit-cluster ./cmd/dpkit-fakedra: %w\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

func cleanupBinaries() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if renderBin != "" && os.Getenv(EnvRender) == "" {
		os.RemoveAll(filepath.Dir(renderBin))
	}
}

// testLogger logs to t.Log, so a failing test shows what the controller did.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
