package e2e

// The DRA manager judged against the kubelet's: the same scenarios run
// against the kubelet's own DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra,
// v1.37.0, run by hack/tools/cmd/kubelet-dramanager, which
// hack/build-upstream.sh builds) and against dpkit's
// (pkg/dramanager), each with its own fake DRA driver
// (cmd/dpkit-fakedra) and the same ResourceClaims from the test
// control plane, and what each showed is compared. docs/dra.md "Judged
// against the kubelet" is the table of these results.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/test/upstream"
)

// draSide is one DRA manager the scenarios drive.
type draSide interface {
	// waitRegistered returns once the fake driver is registered.
	waitRegistered(t *testing.T)
	// prepare and unprepare return the error's text, "" on success.
	prepare(t *testing.T, pod *corev1.Pod) string
	unprepare(t *testing.T, pod *corev1.Pod) string
	// reconcile runs one pass of the reconcile loop with these active pods.
	reconcile(t *testing.T, active ...types.UID)
	// nextUpdate returns the pods of the manager's next health update.
	nextUpdate(t *testing.T) []string
	// status is the allocatedResourcesStatus of the pod's containers.
	status(t *testing.T, pod *corev1.Pod) [][]corev1.ResourceStatus
}

// sbsClaims are the claims of the scenarios, in the API server and in the
// fake drivers' claims directory.
type sbsClaims struct {
	ns    string
	dir   dratest.Claims
	names map[string]string // claim UID -> name
}

// TestDRASideBySideWithKubelet runs the scenarios against both managers
// and compares them step by step: the error for a driver not registered,
// the batched NodePrepareResources, an idempotent prepare (no call), a
// claim shared by two pods (unprepared only by the last), the
// dra_manager_state checkpoint (bytes, claims in one order), reconcile of a
// gone pod, the allocatedResourcesStatus a health report produces, and a
// prepare the driver fails (its error, the claim checkpointed before the
// call, the unprepare after).
func TestDRASideBySideWithKubelet(t *testing.T) {
	bin := upstream.DRAManager(t)
	dratest.Binary(t) // built before the test's deadline starts
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	claims := sbsSetup(t, ctx, c)

	kubelet := runSBSScenarios(t, "kubelet", claims, func(root string) draSide {
		return startKubeletDRA(t, ctx, bin, root, cp.Kubeconfig)
	})
	dpkit := runSBSScenarios(t, "dpkit", claims, func(root string) draSide {
		return startDpkitDRA(t, ctx, c, root)
	})
	if len(kubelet) != len(dpkit) {
		t.Fatalf("kubelet took %d steps, dpkit %d", len(kubelet), len(dpkit))
	}
	for i := range kubelet {
		k, d := kubelet[i], dpkit[i]
		if k.step != d.step {
			t.Fatalf("step %d: kubelet %q, dpkit %q", i, k.step, d.step)
		}
		if k.got != d.got {
			t.Errorf("%s:\n kubelet: %s\n dpkit:   %s", k.step, k.got, d.got)
			continue
		}
		t.Logf("%s: both %s", k.step, k.got)
	}
}

// sbsStep is what one step of the scenarios showed.
type sbsStep struct{ step, got string }

// sbsSetup creates claims a (dev-0), b and c (dev-1) of the fake driver,
// allocated and reserved for pods p0, p1 and p2 (a), p0 and p1 (b) and p3
// (c), as the scheduler would, and writes them where the fake drivers read
// them.
func sbsSetup(t *testing.T, ctx context.Context, c kubernetes.Interface) *sbsClaims {
	t.Helper()
	class := deviceClass(t, ctx, c, "")
	s := &sbsClaims{ns: createNamespace(t, c, "dra-sbs"), dir: dratest.Claims(t.TempDir()), names: map[string]string{}}
	for _, cl := range []struct {
		name, device string
		pods         []string
	}{{"a", "dev-0", []string{"p0", "p1", "p2"}}, {"b", "dev-1", []string{"p0", "p1"}}, {"c", "dev-1", []string{"p3"}}} {
		claim, err := c.ResourceV1().ResourceClaims(s.ns).Create(ctx, claimFor(s.ns, cl.name, class, 1), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
			{Request: "req", Driver: dratest.DriverName, Pool: dratest.Pool, Device: cl.device},
		}}}
		for _, p := range cl.pods {
			claim.Status.ReservedFor = append(claim.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: sbsUID(p)})
		}
		if claim, err = c.ResourceV1().ResourceClaims(s.ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		blob, err := json.Marshal(claim)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(string(s.dir), s.ns+"_"+cl.name+".json"), blob, 0o600); err != nil {
			t.Fatal(err)
		}
		s.names[string(claim.UID)] = cl.name
	}
	return s
}

// sbsUID is the UID of scenario pod name: the same on both sides, so the
// checkpoints can be compared.
func sbsUID(pod string) types.UID { return types.UID("sbs-" + pod) }

// runSBSScenarios runs the scenarios against the manager start returns for
// a fresh root, with a fresh fake driver, and returns what each step showed.
func runSBSScenarios(t *testing.T, side string, claims *sbsClaims, start func(root string) draSide) []sbsStep {
	t.Helper()
	root := testdir.Short(t, "vn")
	m := start(root)
	var steps []sbsStep
	record := func(step, got string) { steps = append(steps, sbsStep{step, got}) }
	pod := func(name string, cls ...string) *corev1.Pod {
		return dratest.Pod(claims.ns, name, sbsUID(name), cls...)
	}
	call := func(d *dratest.Driver) string {
		method, uids := d.NextCall(t)
		names := make([]string, 0, len(uids))
		for _, u := range uids {
			names = append(names, claims.names[u])
		}
		slices.Sort(names)
		return fmt.Sprintf("%s %v", method, names)
	}
	p0, p1, p2, p3 := pod("p0", "a"), pod("p1", "a", "b"), pod("p2", "a"), pod("p3", "c")

	record("prepare with the driver not registered", fmt.Sprintf("error %q", m.prepare(t, p0)))
	record("checkpoint after a refused prepare", sbsCheckpoint(t, root))

	drv := dratest.Start(t, root, claims.dir)
	m.waitRegistered(t)
	record("prepare p1 (claims a, b)", fmt.Sprintf("error %q", m.prepare(t, p1)))
	record("driver call for p1", call(drv))
	record("prepare p1 again", fmt.Sprintf("error %q", m.prepare(t, p1)))
	record("checkpoint after prepare", sbsCheckpoint(t, root))
	record("prepare p2 (claim a, shared with p1)", fmt.Sprintf("error %q", m.prepare(t, p2)))
	record("checkpoint with a shared claim", sbsCheckpoint(t, root))
	// The next call the driver saw: none came from the second prepare of
	// p1, nor from p2's (its claim was prepared).
	record("unprepare p1", fmt.Sprintf("error %q", m.unprepare(t, p1)))
	record("driver call for p1's unprepare (a is p2's too)", call(drv))
	record("checkpoint after p1's unprepare", sbsCheckpoint(t, root))

	drv.Send(t, "health dev-0 Unhealthy fan stopped")
	var st [][]corev1.ResourceStatus
	for {
		if pods := m.nextUpdate(t); !slices.Contains(pods, string(sbsUID("p2"))) {
			continue
		}
		st = m.status(t, p2)
		if sbsUnhealthy(st) {
			break
		}
	}
	blob, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	record("p2's allocatedResourcesStatus after dev-0 turned Unhealthy", string(blob))

	m.reconcile(t) // p2 is gone without an unprepare
	record("driver call for the reconcile of gone p2", call(drv))
	record("checkpoint after reconcile", sbsCheckpoint(t, root))

	drv.Send(t, "fail-prepare out of widgets")
	record("prepare p3 (claim c) while the driver fails", fmt.Sprintf("error %q", m.prepare(t, p3)))
	record("driver call for p3", call(drv))
	record("checkpoint after a failed prepare", sbsCheckpoint(t, root))
	drv.Send(t, "heal")
	record("unprepare p3", fmt.Sprintf("error %q", m.unprepare(t, p3)))
	record("driver call for p3's unprepare", call(drv))
	record("checkpoint after p3's unprepare", sbsCheckpoint(t, root))
	drv.NoMoreCalls(t)
	t.Logf("%s: %d steps", side, len(steps))
	return steps
}

func sbsUnhealthy(st [][]corev1.ResourceStatus) bool {
	for _, c := range st {
		for _, rs := range c {
			for _, r := range rs.Resources {
				if r.Health == corev1.ResourceHealthStatusUnhealthy {
					return true
				}
			}
		}
	}
	return false
}

// sbsCheckpoint returns root/dra_manager_state with its claims sorted by
// namespace and name (the kubelet writes them in its map's order) and the
// checksum computed again; everything else is the file's bytes. A checksum
// that does not match the file's data fails the test.
func sbsCheckpoint(t *testing.T, root string) string {
	t.Helper()
	blob, err := os.ReadFile(filepath.Join(root, "dra_manager_state"))
	if os.IsNotExist(err) {
		return "no file"
	}
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Data     string
		Checksum uint32
	}
	if err := json.Unmarshal(blob, &f); err != nil {
		t.Fatalf("dra_manager_state: %v\n%s", err, blob)
	}
	if sum := crc32.ChecksumIEEE([]byte(f.Data)); sum != f.Checksum {
		t.Fatalf("dra_manager_state: checksum %d, data's %d", f.Checksum, sum)
	}
	var d struct {
		Kind               string            `json:"kind,omitempty"`
		APIVersion         string            `json:"apiVersion,omitempty"`
		ClaimInfoStateList []json.RawMessage `json:"ClaimInfoStateList"`
	}
	if err := json.Unmarshal([]byte(f.Data), &d); err != nil {
		t.Fatalf("dra_manager_state data: %v\n%s", err, f.Data)
	}
	key := func(raw json.RawMessage) string {
		var c struct{ Namespace, ClaimName string }
		_ = json.Unmarshal(raw, &c)
		return c.Namespace + "/" + c.ClaimName
	}
	slices.SortFunc(d.ClaimInfoStateList, func(a, b json.RawMessage) int { return strings.Compare(key(a), key(b)) })
	inner, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	data := string(inner)
	out, err := json.Marshal(struct {
		Data     string
		Checksum uint32
	}{data, crc32.ChecksumIEEE([]byte(data))})
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// kubeletDRA is a running kubelet-dramanager.
type kubeletDRA struct {
	stdin  io.WriteCloser
	events chan map[string]any
	mu     sync.Mutex
	seen   []string
}

func startKubeletDRA(t *testing.T, ctx context.Context, bin, root, kubeconfig string) *kubeletDRA {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "kubelet-dramanager.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := upstream.Command(bin, "-v", "4", "--root", root, "--kubeconfig", kubeconfig, "--node-name", unique("sbs-kubelet"))
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k := &kubeletDRA{stdin: stdin, events: make(chan map[string]any, 256)}
	go func() {
		defer close(k.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			k.mu.Lock()
			k.seen = append(k.seen, sc.Text())
			k.mu.Unlock()
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) != nil {
				ev = map[string]any{"event": "unparsed"}
			}
			select {
			case k.events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
		_ = logf.Close()
		if t.Failed() {
			logTail(t, logPath)
		}
	})
	k.next(t, "ready", func(ev map[string]any) bool { return ev["event"] == "ready" })
	return k
}

func (k *kubeletDRA) send(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(k.stdin, line); err != nil {
		t.Fatalf("write to kubelet-dramanager: %v", err)
	}
}

// next returns the first event from now on that match accepts; an error
// event fails the test.
func (k *kubeletDRA) next(t *testing.T, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		select {
		case ev, ok := <-k.events:
			if !ok {
				t.Fatalf("kubelet-dramanager exited before %s; it printed:\n%s", what, k.lines())
			}
			if ev["event"] == "error" {
				t.Fatalf("kubelet-dramanager: %v", ev["error"])
			}
			if match(ev) {
				return ev
			}
		case <-deadline.C:
			t.Fatalf("kubelet-dramanager: no %s in %v; it printed:\n%s", what, waitTimeout, k.lines())
		}
	}
}

func (k *kubeletDRA) lines() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return strings.Join(k.seen, "\n")
}

func (k *kubeletDRA) waitRegistered(t *testing.T) {
	t.Helper()
	k.send(t, "wait-registered "+dratest.DriverName)
	k.next(t, "registration", func(ev map[string]any) bool { return ev["event"] == "registered" })
}

func (k *kubeletDRA) podCommand(t *testing.T, verb string, pod *corev1.Pod) map[string]any {
	t.Helper()
	blob, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	k.send(t, verb+" "+string(blob))
	return k.next(t, verb+" of "+pod.Name, func(ev map[string]any) bool { return ev["event"] == verb && ev["pod"] == string(pod.UID) })
}

func (k *kubeletDRA) prepare(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	return k.podCommand(t, "prepare", pod)["error"].(string)
}

func (k *kubeletDRA) unprepare(t *testing.T, pod *corev1.Pod) string {
	t.Helper()
	return k.podCommand(t, "unprepare", pod)["error"].(string)
}

func (k *kubeletDRA) reconcile(t *testing.T, active ...types.UID) {
	t.Helper()
	uids := make([]string, 0, len(active))
	for _, u := range active {
		uids = append(uids, string(u))
	}
	k.send(t, "reconcile "+strings.Join(uids, ","))
	k.next(t, "reconcile", func(ev map[string]any) bool { return ev["event"] == "reconciled" })
}

func (k *kubeletDRA) nextUpdate(t *testing.T) []string {
	t.Helper()
	ev := k.next(t, "health update", func(ev map[string]any) bool { return ev["event"] == "update" })
	var pods []string
	for _, p := range ev["pods"].([]any) {
		pods = append(pods, p.(string))
	}
	return pods
}

func (k *kubeletDRA) status(t *testing.T, pod *corev1.Pod) [][]corev1.ResourceStatus {
	t.Helper()
	ev := k.podCommand(t, "status", pod)
	blob, err := json.Marshal(ev["containers"])
	if err != nil {
		t.Fatal(err)
	}
	var cs []struct {
		AllocatedResourcesStatus []corev1.ResourceStatus `json:"allocatedResourcesStatus"`
	}
	if err := json.Unmarshal(blob, &cs); err != nil {
		t.Fatal(err)
	}
	out := make([][]corev1.ResourceStatus, 0, len(cs))
	for _, c := range cs {
		out = append(out, sortedStatus(c.AllocatedResourcesStatus))
	}
	return out
}

// sortedStatus orders what the kubelet builds from maps.
func sortedStatus(st []corev1.ResourceStatus) []corev1.ResourceStatus {
	slices.SortFunc(st, func(a, b corev1.ResourceStatus) int { return strings.Compare(string(a.Name), string(b.Name)) })
	for _, s := range st {
		slices.SortFunc(s.Resources, func(a, b corev1.ResourceHealth) int {
			return strings.Compare(string(a.ResourceID), string(b.ResourceID))
		})
	}
	return st
}

// dpkitDRA is dpkit's DRA manager with its plugin watcher on the root's
// plugins_registry, reading claims from the API server.
type dpkitDRA struct {
	ctx context.Context
	m   *dramanager.Manager
}

type sbsAPIClaims struct{ c kubernetes.Interface }

func (a sbsAPIClaims) GetResourceClaim(ctx context.Context, ns, name string) (*resourcev1.ResourceClaim, error) {
	return a.c.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
}

func startDpkitDRA(t *testing.T, ctx context.Context, c kubernetes.Interface, root string) *dpkitDRA {
	t.Helper()
	// No ActivePods: the reconcile loop runs only when the test says.
	m, err := dramanager.New(dramanager.Config{Root: root, Claims: sbsAPIClaims{c}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      filepath.Join(root, "plugins_registry"),
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DRAPlugin: m.PluginHandler()},
	})
	if err == nil {
		err = w.Start(ctx)
	}
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		<-w.Done()
		m.Stop()
	})
	return &dpkitDRA{ctx: ctx, m: m}
}

func (d *dpkitDRA) waitRegistered(t *testing.T) {
	t.Helper()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for {
		changed := d.m.PluginsChanged()
		for _, p := range d.m.Plugins() {
			if p.Driver == dratest.DriverName {
				return
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("the fake driver did not register in %v", waitTimeout)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (d *dpkitDRA) prepare(_ *testing.T, pod *corev1.Pod) string {
	return errText(d.m.PrepareResources(d.ctx, pod))
}

func (d *dpkitDRA) unprepare(_ *testing.T, pod *corev1.Pod) string {
	return errText(d.m.UnprepareResources(d.ctx, pod))
}

func (d *dpkitDRA) reconcile(t *testing.T, active ...types.UID) {
	t.Helper()
	if err := d.m.Reconcile(d.ctx, active); err != nil {
		t.Logf("dpkit reconcile: %v", err)
	}
}

func (d *dpkitDRA) nextUpdate(t *testing.T) []string {
	t.Helper()
	select {
	case uids := <-d.m.Updates():
		out := make([]string, 0, len(uids))
		for _, u := range uids {
			out = append(out, string(u))
		}
		return out
	case <-time.After(waitTimeout):
		t.Fatalf("no health update in %v", waitTimeout)
		return nil
	}
}

func (d *dpkitDRA) status(_ *testing.T, pod *corev1.Pod) [][]corev1.ResourceStatus {
	st := &corev1.PodStatus{}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name})
	}
	d.m.UpdateAllocatedResourcesStatus(pod, st)
	out := make([][]corev1.ResourceStatus, 0, len(st.ContainerStatuses))
	for _, c := range st.ContainerStatuses {
		out = append(out, sortedStatus(c.AllocatedResourcesStatus))
	}
	return out
}
