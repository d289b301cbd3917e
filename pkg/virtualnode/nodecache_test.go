package virtualnode

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// gets counts the GETs of nodes client has made.
func gets(client *fake.Clientset) int {
	n := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "get" && a.GetResource().Resource == "nodes" {
			n++
		}
	}
	return n
}

// TestNodeCache: the node's reads of its own Node are answered from what
// it last read or wrote, and a failed write makes the next read ask the
// API server.
func TestNodeCache(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}})
	c := newNodeCache(client.CoreV1().Nodes(), "vn")

	// Created first, as the kubelet registers: the controller's first
	// read asks nothing.
	if _, err := c.Get(ctx, "vn", metav1.GetOptions{}); !apierrors.IsNotFound(err) || gets(client) != 0 {
		t.Fatalf("first Get: %v after %d GETs, want NotFound without one", err, gets(client))
	}
	if _, err := c.read(ctx); !apierrors.IsNotFound(err) {
		t.Fatalf("read of a Node not yet registered: %v, want NotFound", err)
	}
	if _, err := c.Get(ctx, "vn", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Get after a read that found none: %v, want NotFound", err)
	}
	if got := gets(client); got != 1 {
		t.Fatalf("%d GETs, want 1: the read's NotFound answers the next Get", got)
	}
	// Only once: a later Get asks again.
	if _, err := c.Get(ctx, "vn", metav1.GetOptions{}); !apierrors.IsNotFound(err) || gets(client) != 2 {
		t.Fatalf("second Get: %v after %d GETs, want NotFound from a second GET", err, gets(client))
	}

	if _, err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn", Labels: map[string]string{"a": "1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "vn", metav1.GetOptions{})
	if err != nil || got.Labels["a"] != "1" || gets(client) != 2 {
		t.Fatalf("Get after Create: %v, %v after %d GETs; want the created Node and no GET", got, err, gets(client))
	}
	got.Labels["a"] = "changed by the caller"
	if again, _ := c.Get(ctx, "vn", metav1.GetOptions{}); again.Labels["a"] != "1" {
		t.Fatal("Get returned the cached Node itself, not a copy")
	}

	patched, err := c.Patch(ctx, "vn", types.MergePatchType, []byte(`{"status":{"phase":"Running"}}`), metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Get(ctx, "vn", metav1.GetOptions{}); got.ResourceVersion != patched.ResourceVersion || got.Status.Phase != corev1.NodeRunning || gets(client) != 2 {
		t.Fatalf("Get after Patch: %q %q after %d GETs; want the patched Node (%q) and no GET", got.ResourceVersion, got.Status.Phase, gets(client), patched.ResourceVersion)
	}

	// Another name is not the node's: always the API server.
	if _, err := c.Get(ctx, "other", metav1.GetOptions{}); err != nil || gets(client) != 3 {
		t.Fatalf("Get of another Node: %v after %d GETs, want one GET", err, gets(client))
	}

	// A failed write forgets the copy.
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &corev1.Node{}, errors.New("connection reset")
	})
	if _, err := c.Patch(ctx, "vn", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status"); err == nil {
		t.Fatal("the failing Patch succeeded")
	}
	if got, err := c.Get(ctx, "vn", metav1.GetOptions{}); err != nil || got.Status.Phase != corev1.NodeRunning || gets(client) != 4 {
		t.Fatalf("Get after a failed Patch: %v after %d GETs, want a GET of the API server's Node", err, gets(client))
	}
}

// TestRemoveStartupTaints: the start-up taints go with one JSON patch that
// only applies while the taints are as read, and other taints stay; when
// the taints changed since (the patch's test fails, 422), they are read
// again and the others' change is kept.
func TestRemoveStartupTaints(t *testing.T) {
	ctx := context.Background()
	notReady := corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoSchedule}
	own := corev1.Taint{Key: DefaultTaintKey, Effect: corev1.TaintEffectNoSchedule}
	added := corev1.Taint{Key: "example.com/maintenance", Effect: corev1.TaintEffectNoExecute}
	client := fake.NewClientset()
	n := &Node{cfg: Config{Name: "vn", Client: client}, log: slog.New(slog.DiscardHandler), nodes: newNodeCache(client.CoreV1().Nodes(), "vn")}
	if _, err := n.nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{own, notReady}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Someone adds a taint after the node cached its Node: the first
	// patch's test fails as the API server's does.
	if _, err := client.CoreV1().Nodes().Update(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{own, notReady, added}}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var patches int
	client.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		patches++
		p := a.(k8stesting.PatchAction)
		var ops []struct{ Op, Path string }
		if err := json.Unmarshal(p.GetPatch(), &ops); p.GetPatchType() != types.JSONPatchType || err != nil || len(ops) != 2 || ops[0].Op != "test" || ops[0].Path != "/spec/taints" {
			t.Errorf("patch %s %s, want a JSON patch that tests /spec/taints first", p.GetPatchType(), p.GetPatch())
		}
		if patches == 1 {
			return true, nil, apierrors.NewGenericServerResponse(http.StatusUnprocessableEntity, "patch", corev1.Resource("nodes"), "vn", "the server rejected our request due to an error in our request", 0, false)
		}
		return false, nil, nil
	})
	n.removeStartupTaints(ctx)
	got, err := client.CoreV1().Nodes().Get(ctx, "vn", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []corev1.Taint{own, added}; !slices.Equal(got.Spec.Taints, want) {
		t.Fatalf("taints %v, want %v", got.Spec.Taints, want)
	}
	if patches != 2 || gets(client) != 2 { // the test's Get and one retry's
		t.Fatalf("%d patches and %d GETs, want 2 and 2", patches, gets(client))
	}

	// The taints as the node last wrote them: nothing to remove, no request.
	before := len(client.Actions())
	n.removeStartupTaints(ctx)
	if len(client.Actions()) != before {
		t.Fatalf("%d requests with no start-up taint left, want none", len(client.Actions())-before)
	}
}

// TestRegistrationRetried: until the node's Node is first written, a
// request that failed for a reason that passes is made again, as the
// kubelet retries its registration; a Create whose timed-out attempt did
// create the Node takes it; a refusal that will not pass (Forbidden) ends
// the registration at once; and once registered, nothing is retried.
func TestRegistrationRetried(t *testing.T) {
	ctx := context.Background()
	fast := func(c *nodeCache) *nodeCache {
		c.retry = wait.Backoff{Duration: time.Millisecond, Factor: 1, Steps: math.MaxInt32}
		return c
	}
	countCreates := func(client *fake.Clientset) int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "create" && a.GetResource().Resource == "nodes" {
				n++
			}
		}
		return n
	}
	vn := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn"}}

	// The first two POSTs time out; the second's did create the Node.
	client := fake.NewClientset()
	tracker := client.Tracker()
	attempts := 0
	client.PrependReactor("create", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		attempts++
		switch attempts {
		case 1:
			return true, nil, &url.Error{Op: "Post", URL: "https://apiserver/api/v1/nodes", Err: context.DeadlineExceeded}
		case 2:
			if err := tracker.Create(corev1.SchemeGroupVersion.WithResource("nodes"), vn.DeepCopy(), ""); err != nil {
				t.Fatal(err)
			}
			return true, nil, apierrors.NewTimeoutError("request did not complete within the allowed duration", 0)
		}
		return false, nil, nil
	})
	c := fast(newNodeCache(client.CoreV1().Nodes(), "vn"))
	got, err := c.Create(ctx, vn.DeepCopy(), metav1.CreateOptions{})
	if err != nil || got == nil || got.Name != "vn" {
		t.Fatalf("Create through two timeouts: %v, %v; want the Node", got, err)
	}
	if n := countCreates(client); n != 3 {
		t.Fatalf("%d POSTs, want 3 (two timed out, the third found the Node the second made)", n)
	}
	if !c.registered.Load() {
		t.Fatal("not registered after the Node was created")
	}
	// Registered: a failure is returned at once.
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("restarting")
	})
	if _, err := c.Patch(ctx, "vn", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status"); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("Patch after registration: %v, want the API server's error returned at once", err)
	}

	// Forbidden does not pass: one attempt.
	client = fake.NewClientset()
	client.PrependReactor("create", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "vn", errors.New("no RBAC"))
	})
	c = fast(newNodeCache(client.CoreV1().Nodes(), "vn"))
	if _, err := c.Create(ctx, vn.DeepCopy(), metav1.CreateOptions{}); !apierrors.IsForbidden(err) || countCreates(client) != 1 {
		t.Fatalf("Create refused: %v after %d POSTs, want Forbidden after one", err, countCreates(client))
	}

	// The status write of a node that exists (a restart) is retried too,
	// and the context's end stops the retries.
	client = fake.NewClientset(vn.DeepCopy())
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewTooManyRequests("busy", 1)
	})
	c = fast(newNodeCache(client.CoreV1().Nodes(), "vn"))
	cctx, cancel := context.WithCancel(ctx)
	patches := 0
	client.PrependReactor("patch", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		if patches++; patches == 5 {
			cancel()
		}
		return false, nil, nil
	})
	if _, err := c.Patch(cctx, "vn", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status"); !apierrors.IsTooManyRequests(err) || patches != 5 {
		t.Fatalf("Patch while the API server is busy: %v after %d attempts, want TooManyRequests after 5 (the context ended)", err, patches)
	}
}

// TestTransient: what the registration retries, and what it does not.
func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"request timeout", &url.Error{Op: "Post", URL: "https://a/api/v1/nodes", Err: context.DeadlineExceeded}, true},
		{"server timeout", apierrors.NewTimeoutError("slow", 1), true},
		{"too many requests", apierrors.NewTooManyRequests("busy", 1), true},
		{"internal error", apierrors.NewInternalError(errors.New("etcd")), true},
		{"unavailable", apierrors.NewServiceUnavailable("restarting"), true},
		{"connection refused", &url.Error{Op: "Post", URL: "https://a", Err: syscall.ECONNREFUSED}, true},
		{"forbidden", apierrors.NewForbidden(corev1.Resource("nodes"), "vn", errors.New("no")), false},
		{"invalid", apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Node").GroupKind(), "vn", nil), false},
		{"untrusted certificate", &url.Error{Op: "Post", URL: "https://a", Err: x509.UnknownAuthorityError{}}, false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("transient(%s: %v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
