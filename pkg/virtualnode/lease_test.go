package virtualnode

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// leaseActions are the verbs of the Lease requests client has made.
func leaseActions(client *fake.Clientset) []string {
	var out []string
	for _, a := range client.Actions() {
		if a.GetResource().Resource == "leases" && a.GetVerb() != "watch" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

// TestLeaseCreateFirst: the node's Lease is created without being read
// first; a Lease an earlier run left is renewed in the Create's place, its
// holder kept, as the kubelet's lease controller renews a Lease it found.
func TestLeaseCreateFirst(t *testing.T) {
	ctx := context.Background()
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "vn", UID: "uid-2"}}
	renew := metav1.NewMicroTime(time.Unix(2000, 0))
	want := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "vn", Namespace: corev1.NamespaceNodeLease, OwnerReferences: owner},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("vn"), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &renew},
	}

	// Afresh: one request.
	client := fake.NewClientset()
	c := newLeaseCreateFirst(client.CoordinationV1().Leases(corev1.NamespaceNodeLease))
	if _, err := c.Get(ctx, "vn", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("first Get: %v, want NotFound", err)
	}
	if _, err := c.Create(ctx, want.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := leaseActions(client); len(got) != 1 || got[0] != "create" {
		t.Fatalf("requests %v, want one create", got)
	}
	// Later reads ask the API server.
	if l, err := c.Get(ctx, "vn", metav1.GetOptions{}); err != nil || l.Spec.RenewTime == nil {
		t.Fatalf("second Get: %v, %v; want the Lease", l, err)
	}

	// A restart: the earlier run's Lease, held by someone else, shorter,
	// renewed long ago, owned by a Node since replaced.
	old := metav1.NewMicroTime(time.Unix(1000, 0))
	client = fake.NewClientset(&coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "vn", Namespace: corev1.NamespaceNodeLease, OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: "vn", UID: "uid-1"}}},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: ptr.To("other"), LeaseDurationSeconds: ptr.To[int32](15), RenewTime: &old},
	})
	c = newLeaseCreateFirst(client.CoordinationV1().Leases(corev1.NamespaceNodeLease))
	_, _ = c.Get(ctx, "vn", metav1.GetOptions{})
	got, err := c.Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("Create over the earlier run's Lease: %v", err)
	}
	if *got.Spec.HolderIdentity != "other" || *got.Spec.LeaseDurationSeconds != 40 || !got.Spec.RenewTime.Equal(&renew) || got.OwnerReferences[0].UID != "uid-1" {
		t.Errorf("renewed Lease %+v %+v; want holder other, 40s, renewed at %v, owner uid-1 kept", got.Spec, got.OwnerReferences, renew)
	}
	if acts := leaseActions(client); len(acts) != 3 || acts[0] != "create" || acts[1] != "get" || acts[2] != "update" {
		t.Errorf("requests %v, want create, get, update", acts)
	}
	if stored, _ := client.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), corev1.NamespaceNodeLease, "vn"); !stored.(*coordinationv1.Lease).Spec.RenewTime.Equal(&renew) {
		t.Error("the renewal was not written")
	}

	// An owner is set where the earlier Lease had none.
	client = fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vn", Namespace: corev1.NamespaceNodeLease}})
	c = newLeaseCreateFirst(client.CoordinationV1().Leases(corev1.NamespaceNodeLease))
	if got, err := c.Create(ctx, want.DeepCopy(), metav1.CreateOptions{}); err != nil || len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != "uid-2" {
		t.Fatalf("Create over a Lease without an owner: %v, %v; want owned by uid-2", got, err)
	}

	// A renewal that conflicts is the lease controller's to retry.
	client = fake.NewClientset(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vn", Namespace: corev1.NamespaceNodeLease}})
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewConflict(coordinationv1.Resource("leases"), "vn", nil)
	})
	c = newLeaseCreateFirst(client.CoordinationV1().Leases(corev1.NamespaceNodeLease))
	if _, err := c.Create(ctx, want.DeepCopy(), metav1.CreateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("Create whose renewal conflicts: %v, want the Conflict", err)
	}
}

// TestRunLeaseOwnedByNode: a node's Lease is created first (no read
// before it), through the heartbeat client, for DefaultLeaseDuration, and
// owned by the node's Node.
func TestRunLeaseOwnedByNode(t *testing.T) {
	hb := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn", UID: types.UID("node-uid")}})
	w, err := hb.CoordinationV1().Leases(corev1.NamespaceNodeLease).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	n := &Node{cfg: Config{Name: "vn", HeartbeatClient: hb}, log: slog.New(slog.DiscardHandler), nodes: newNodeCache(hb.CoreV1().Nodes(), "vn")}
	if _, err := n.nodes.read(context.Background()); err != nil { // registered
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		registered := make(chan struct{})
		close(registered)
		n.runLease(ctx, registered)
	}()
	defer func() { cancel(); <-done }()
	var l *coordinationv1.Lease
	select {
	case ev := <-w.ResultChan():
		l = ev.Object.(*coordinationv1.Lease)
	case <-time.After(30 * time.Second):
		t.Fatal("no Lease within 30s")
	}
	if acts := leaseActions(hb); len(acts) == 0 || acts[0] != "create" {
		t.Errorf("Lease requests %v, want a create first", acts)
	}
	if *l.Spec.HolderIdentity != "vn" || *l.Spec.LeaseDurationSeconds != DefaultLeaseDuration || l.Spec.RenewTime == nil {
		t.Errorf("Lease spec %+v, want held by vn for %ds and renewed", l.Spec, DefaultLeaseDuration)
	}
	if len(l.OwnerReferences) != 1 || l.OwnerReferences[0].Kind != "Node" || l.OwnerReferences[0].UID != "node-uid" {
		t.Errorf("Lease owners %+v, want the Node (node-uid)", l.OwnerReferences)
	}
}

// TestLeaseLogQuietOnStop: what the lease controller logs through klog's
// context logger reaches the node's log until the node stops, errors
// included (logr hands them over without asking Enabled).
func TestLeaseLogQuietOnStop(t *testing.T) {
	var buf bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	l := logr.FromSlogHandler(untilDone{ctx: ctx, Handler: slog.NewTextHandler(&buf, nil)}).WithValues("node", "vn")
	l.Error(errors.New("refused"), "before the stop")
	cancel()
	l.Error(errors.New("context canceled"), "after the stop")
	l.Info("after the stop")
	if got := buf.String(); !strings.Contains(got, "before the stop") || strings.Contains(got, "after the stop") {
		t.Errorf("logged %q; want only what came before the stop", got)
	}
}
