package dramanager

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/repopath"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
)

// The fake DRA driver (hack/tools/cmd/dpkit-fakedra, on the upstream
// kubeletplugin helper) is built once per test binary.
var fakeDRA struct {
	once sync.Once
	path string
	err  error
}

func fakeDRABinary(t *testing.T) string {
	t.Helper()
	fakeDRA.once.Do(func() {
		dir, err := os.MkdirTemp("", "dpkit-fakedra-")
		if err != nil {
			fakeDRA.err = err
			return
		}
		fakeDRA.path = filepath.Join(dir, "dpkit-fakedra")
		cmd := exec.Command("go", "build", "-o", fakeDRA.path, "./cmd/dpkit-fakedra")
		cmd.Dir = repopath.Find("hack/tools")
		if out, err := cmd.CombinedOutput(); err != nil {
			fakeDRA.err = fmt.Errorf("(cd hack/tools && go build ./cmd/dpkit-fakedra): %w\n%s", err, out)
		}
	})
	if fakeDRA.err != nil {
		t.Fatal(fakeDRA.err)
	}
	return fakeDRA.path
}

const driverName = "fake.dpkit.io"

// node is a kubelet root with the manager and a plugin watcher on it, and
// a claims directory both the manager and the fake driver read.
type node struct {
	root, claims string
	m            *Manager
	w            *pluginwatcher.Watcher
	cancel       context.CancelFunc
}

// fileClaims reads claims from <dir>/<namespace>_<name>.json, as the fake
// driver does.
type fileClaims string

func (d fileClaims) GetResourceClaim(_ context.Context, ns, name string) (*resourcev1.ResourceClaim, error) {
	blob, err := os.ReadFile(filepath.Join(string(d), ns+"_"+name+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, apierrors.NewNotFound(resourcev1.Resource("resourceclaims"), name)
	}
	if err != nil {
		return nil, err
	}
	var c resourcev1.ResourceClaim
	return &c, json.Unmarshal(blob, &c)
}

func newNode(t *testing.T, root string, mod func(*Config)) *node {
	t.Helper()
	if root == "" {
		root = t.TempDir()
	}
	n := &node{root: root, claims: filepath.Join(root, "claims")}
	if err := os.MkdirAll(n.claims, 0o750); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Root: root, Claims: fileClaims(n.claims)}
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n.m = m
	n.start(t)
	return n
}

func (n *node) start(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	if err := n.m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      filepath.Join(n.root, "plugins_registry"),
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DRAPlugin: n.m.PluginHandler()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	n.w = w
	t.Cleanup(n.stop)
}

func (n *node) stop() {
	n.cancel()
	<-n.w.Done()
	n.m.Stop()
}

// waitPlugins waits until the manager lists want plugins of the driver,
// all connected.
func (n *node) waitPlugins(t *testing.T, want int) []Plugin {
	t.Helper()
	for {
		ch := n.m.PluginsChanged()
		ps := n.m.Plugins()
		up := 0
		for _, p := range ps {
			if p.Connected {
				up++
			}
		}
		if len(ps) == want && up == want {
			return ps
		}
		<-ch
	}
}

// driver is a running dpkit-fakedra process.
type driver struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan map[string]any
}

func (n *node) startDriver(t *testing.T, args ...string) *driver {
	t.Helper()
	args = append([]string{
		"--registry-dir", filepath.Join(n.root, "plugins_registry"),
		"--plugin-dir", filepath.Join(n.root, "plugins", driverName),
		"--claims-dir", n.claims,
	}, args...)
	cmd := exec.Command(fakeDRABinary(t), args...)
	cmd.Stderr = os.Stderr
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
	d := &driver{cmd: cmd, stdin: stdin, events: make(chan map[string]any, 100)}
	go func() {
		defer close(d.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev map[string]any
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				d.events <- ev
			}
		}
	}()
	t.Cleanup(d.stop)
	if ev := d.next(t); ev["event"] != "ready" {
		t.Fatalf("first event %v, want ready", ev)
	}
	return d
}

func (d *driver) stop() {
	_ = d.stdin.Close()
	_ = d.cmd.Wait()
	for range d.events { //nolint:revive // drain
	}
}

// kill ends the driver at once, as a crash: its sockets stay.
func (d *driver) kill() {
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
}

// send sends a command and waits until it took effect.
func (d *driver) send(t *testing.T, line string) {
	t.Helper()
	if _, err := fmt.Fprintln(d.stdin, line); err != nil {
		t.Fatal(err)
	}
	for {
		switch ev := d.next(t); ev["event"] {
		case "done":
			return
		case "call":
			t.Fatalf("unexpected driver call %v while sending %q", ev, line)
		case "error":
			t.Fatalf("command %q: %v", line, ev["error"])
		}
	}
}

func (d *driver) next(t *testing.T) map[string]any {
	t.Helper()
	ev, ok := <-d.events
	if !ok {
		t.Fatal("the fake driver exited")
	}
	return ev
}

// nextCall returns the next call the driver reports: method and claim UIDs.
func (d *driver) nextCall(t *testing.T) (string, []string) {
	t.Helper()
	for {
		ev := d.next(t)
		if ev["event"] != "call" {
			continue
		}
		var uids []string
		for _, u := range ev["claims"].([]any) {
			uids = append(uids, u.(string))
		}
		return ev["method"].(string), uids
	}
}

// noMoreCalls stops the driver and fails if it reported a call not read.
func (d *driver) noMoreCalls(t *testing.T) {
	t.Helper()
	_ = d.stdin.Close()
	for ev := range d.events {
		if ev["event"] == "call" {
			t.Errorf("unexpected driver call %v", ev)
		}
	}
	_ = d.cmd.Wait()
}

// addClaim writes an allocated claim reserved for pods, its devices from
// the fake driver's pool.
func (n *node) addClaim(t *testing.T, ns, name string, uid types.UID, reservedFor []types.UID, devices ...string) *resourcev1.ResourceClaim {
	t.Helper()
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid},
		Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{},
		},
	}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourcev1.DeviceRequestAllocationResult{
			Request: "req", Driver: driverName, Pool: "pool", Device: d,
		})
	}
	for _, u := range reservedFor {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: u})
	}
	blob, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.claims, ns+"_"+name+".json"), blob, 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// podWith returns a pod using the named claims in one container "main".
func podWith(ns, name string, uid types.UID, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid}}
	c := corev1.Container{Name: "main"}
	for _, cl := range claims {
		n := cl
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: cl, ResourceClaimName: &n})
		c.Resources.Claims = append(c.Resources.Claims, corev1.ResourceClaim{Name: cl})
	}
	p.Spec.Containers = []corev1.Container{c}
	return p
}

func writeFile(path, s string) error { return os.WriteFile(path, []byte(s), 0o600) }
