// Package dratest runs the fake DRA driver (cmd/dpkit-fakedra,
// built on the upstream kubeletplugin helper) as a process for tests of a
// DRA manager, and keeps ResourceClaims in files both sides read, so no
// API server is needed.
package dratest

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
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// DriverName is the fake driver's name; Pool the pool of its devices.
const (
	DriverName = "fake.dpkit.io"
	Pool       = "pool"
)

// CDIDeviceID is the CDI device ID the fake driver gives device.
func CDIDeviceID(device string) string { return DriverName + "/device=" + device }

// The fake DRA driver is built once per test binary.
var fakeDRA struct {
	once sync.Once
	path string
	err  error
}

// Binary builds dpkit-fakedra (once per test binary) and returns its path.
func Binary(t testing.TB) string {
	t.Helper()
	fakeDRA.once.Do(func() {
		dir, err := os.MkdirTemp("", "dpkit-fakedra-")
		if err != nil {
			fakeDRA.err = err
			return
		}
		fakeDRA.path = filepath.Join(dir, "dpkit-fakedra")
		// By import path: it builds in any module that requires dpkit.
		cmd := exec.Command("go", "build", "-o", fakeDRA.path, "github.com/dpkit/dpkit/cmd/dpkit-fakedra")
		if out, err := cmd.CombinedOutput(); err != nil {
			fakeDRA.err = fmt.Errorf("go build github.com/dpkit/dpkit/cmd/dpkit-fakedra: %w\n%s", err, out)
		}
	})
	if fakeDRA.err != nil {
		t.Fatal(fakeDRA.err)
	}
	return fakeDRA.path
}

// RemoveBinary removes what Binary built: call it from TestMain, after
// the package's tests ran (the binary is built once per test binary, so
// no single test can remove it).
func RemoveBinary() {
	if fakeDRA.path != "" {
		_ = os.RemoveAll(filepath.Dir(fakeDRA.path))
	}
}

// Claims is a directory of ResourceClaims, <namespace>_<name>.json, that
// the fake driver reads; it is also a dramanager.ClaimGetter.
type Claims string

// GetResourceClaim reads a claim; a missing one is NotFound.
func (d Claims) GetResourceClaim(_ context.Context, ns, name string) (*resourcev1.ResourceClaim, error) {
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

// Add writes an allocated claim reserved for pods, one result of request
// "req" per device of the fake driver's pool.
func (d Claims) Add(t testing.TB, ns, name string, uid types.UID, reservedFor []types.UID, devices ...string) *resourcev1.ResourceClaim {
	t.Helper()
	c := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid},
		Status:     resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{}},
	}
	for _, dev := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourcev1.DeviceRequestAllocationResult{
			Request: "req", Driver: DriverName, Pool: Pool, Device: dev,
		})
	}
	for _, u := range reservedFor {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: "p", UID: u})
	}
	d.Put(t, c)
	return c
}

// Put writes c as it is (a claim Add made, then changed: a subrequest, an
// admin-access result).
func (d Claims) Put(t testing.TB, c *resourcev1.ResourceClaim) {
	t.Helper()
	ns, name := c.Namespace, c.Name
	blob, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(string(d), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(string(d), ns+"_"+name+".json"), blob, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Pod returns a pod using the named claims (by name) in one container
// "main".
func Pod(ns, name string, uid types.UID, claims ...string) *corev1.Pod {
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

// Driver is a running dpkit-fakedra process.
type Driver struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan map[string]any
}

// Start runs the fake driver for the kubelet root (registering in
// root/plugins_registry, serving in root/plugins/<driver>), reading claims
// from claims, with extra flags args. It returns once the driver is up;
// the test's cleanup stops it.
func Start(t testing.TB, root string, claims Claims, args ...string) *Driver {
	t.Helper()
	args = append([]string{
		"--registry-dir", filepath.Join(root, "plugins_registry"),
		"--plugin-dir", filepath.Join(root, "plugins", DriverName),
		"--claims-dir", string(claims),
	}, args...)
	cmd := exec.Command(Binary(t), args...)
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
	d := &Driver{cmd: cmd, stdin: stdin, events: make(chan map[string]any, 100)}
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
	t.Cleanup(d.Stop)
	if ev := d.next(t); ev["event"] != "ready" {
		t.Fatalf("first event %v, want ready", ev)
	}
	return d
}

// Stop ends the driver as a clean shutdown (its sockets removed).
func (d *Driver) Stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.stdin.Close()
	_ = d.cmd.Wait()
	for range d.events { //nolint:revive // drain
	}
}

// Kill ends the driver at once, as a crash: its sockets stay.
func (d *Driver) Kill() {
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
}

// Send sends a command (see dpkit-fakedra) and waits until it took effect.
func (d *Driver) Send(t testing.TB, line string) {
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

// EventTimeout bounds the wait for the driver's next event (a call, a
// command's answer), so that a call that never comes fails the test with
// a message instead of hanging it.
const EventTimeout = time.Minute

func (d *Driver) next(t testing.TB) map[string]any {
	t.Helper()
	select {
	case ev, ok := <-d.events:
		if !ok {
			t.Fatal("the fake driver exited")
		}
		return ev
	case <-time.After(EventTimeout):
		t.Fatalf("the fake driver reported nothing for %v (a call that never came?)", EventTimeout)
		return nil
	}
}

// NextCall returns the next call the driver received: its method and the
// claims' UIDs.
func (d *Driver) NextCall(t testing.TB) (string, []string) {
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

// DrainCalls discards the calls the driver reported so far and not yet
// returned by NextCall, and returns how many there were. A call still on
// its way from the driver's process may be left for NextCall.
func (d *Driver) DrainCalls() int {
	n := 0
	for {
		select {
		case ev, ok := <-d.events:
			if !ok {
				return n
			}
			if ev["event"] == "call" {
				n++
			}
		default:
			return n
		}
	}
}

// NoMoreCalls stops the driver and fails if it received a call NextCall
// did not return.
func (d *Driver) NoMoreCalls(t testing.TB) {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	_ = d.stdin.Close()
	for ev := range d.events {
		if ev["event"] == "call" {
			t.Errorf("unexpected driver call %v", ev)
		}
	}
	_ = d.cmd.Wait()
}
