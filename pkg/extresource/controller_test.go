package extresource

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

func newNode(name string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status:     corev1.NodeStatus{Capacity: list("cpu", "2"), Allocatable: list("cpu", "2")},
	}
}

// waitStatus waits until the node's capacity and allocatable hold exactly
// want among the names in want and gone.
func waitStatus(t *testing.T, c kubernetes.Interface, node string, want corev1.ResourceList, gone ...corev1.ResourceName) {
	t.Helper()
	var last *corev1.Node
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = n
		for _, l := range []corev1.ResourceList{n.Status.Capacity, n.Status.Allocatable} {
			for name, q := range want {
				if have, ok := l[name]; !ok || have.Cmp(q) != 0 {
					return false, nil
				}
			}
			for _, name := range gone {
				if _, ok := l[name]; ok {
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("node %s: want %v without %v: %v; last status %+v", node, want, gone, err, last.Status)
	}
}

func TestAdvertiserApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fake.NewClientset(newNode("n1"))
	adv, err := NewAdvertiser(AdvertiserConfig{Client: c})
	if err != nil {
		t.Fatal(err)
	}
	change, err := adv.Apply(ctx, "n1", list("example.com/dongle", "4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if q := change.Set["example.com/dongle"]; q.Value() != 4 {
		t.Fatalf("change = %+v", change)
	}
	waitStatus(t, c, "n1", list("example.com/dongle", "4", "cpu", "2"))
	// Idempotent: nothing more is sent.
	before := len(c.Actions())
	change, err = adv.Apply(ctx, "n1", list("example.com/dongle", "4"), nil)
	if err != nil || !change.Empty() {
		t.Fatalf("second Apply = %+v, %v; want no change", change, err)
	}
	for _, a := range c.Actions()[before:] {
		if a.GetVerb() == "patch" {
			t.Fatalf("second Apply sent %v", a)
		}
	}
	if _, err := adv.Apply(ctx, "n1", nil, []corev1.ResourceName{"example.com/dongle"}); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "n1", list("cpu", "2"), "example.com/dongle")
	if _, err := adv.Apply(ctx, "missing", list("example.com/dongle", "1"), nil); err == nil {
		t.Fatal("Apply on a missing node succeeded")
	}
}

func TestNewControllerValidates(t *testing.T) {
	t.Parallel()
	_, err := NewController(ControllerConfig{})
	for _, w := range []string{"Client is nil", "NodeName is empty", "no resources"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("NewController({}) = %v, want it to mention %q", err, w)
		}
	}
}

func TestController(t *testing.T) {
	t.Parallel()
	c := fake.NewClientset(newNode("n1"), newNode("other"))
	dir := t.TempDir()
	file := filepath.Join(dir, "resources.yaml")
	write := func(body string) {
		t.Helper()
		tmp := filepath.Join(dir, "tmp")
		if err := os.WriteFile(tmp, []byte("apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\n"+body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write("resources:\n- name: example.com/a\n  quantity: 2\n- name: example.com/b\n")
	ctrl, err := NewController(ControllerConfig{
		Client: c, NodeName: "n1", File: file, RemoveOnExit: true,
		Overrides: corev1.ResourceList{"example.com/c": resource.MustParse("7")},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	waitStatus(t, c, "n1", list("example.com/a", "2", "example.com/b", "1", "example.com/c", "7"))

	// Dropped behind the controller's back: restored.
	patch := `[{"op":"remove","path":"/status/capacity/example.com~1a"}]`
	if _, err := c.CoreV1().Nodes().Patch(ctx, "n1", types.JSONPatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c, "n1", list("example.com/a", "2", "example.com/b", "1", "example.com/c", "7"))

	// An invalid file is ignored; the next valid one applies.
	write("resources:\n- name: nodomain\n")
	write("resources:\n- name: example.com/b\n  quantity: 5\n")
	waitStatus(t, c, "n1", list("example.com/b", "5", "example.com/c", "7"), "example.com/a")

	cancel()
	select {
	case err := <-done:
		done <- err
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	waitStatus(t, c, "n1", list("cpu", "2"), "example.com/a", "example.com/b", "example.com/c")
	other, err := c.CoreV1().Nodes().Get(context.Background(), "other", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(other.Status.Capacity) != 1 {
		t.Fatalf("other node touched: %v", other.Status.Capacity)
	}
}

func TestControllerBadFileAtStart(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(file, []byte("kind: Nope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctrl, err := NewController(ControllerConfig{Client: fake.NewClientset(), NodeName: "n", File: file})
	if err != nil {
		t.Fatal(err)
	}
	err = ctrl.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "kind") {
		t.Fatalf("Run with a bad file = %v, want the validation error", err)
	}
}
