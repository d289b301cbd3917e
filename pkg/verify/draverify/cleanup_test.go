package draverify

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dpkit/dpkit/pkg/verify"
)

// reservedClaim is a claim as the run writes it: allocated and reserved
// for verify's pod, which never exists.
func reservedClaim(ns, name string, finalizers ...string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: finalizers},
		Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
				Request: "req", Driver: "dev.example.com", Pool: "node", Device: "dev-0",
			}}}},
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "dpkit-verify", UID: "dpkit-verify-pod-x"}},
		},
	}
}

// TestCleanupAPI checks what a run leaves on the API server: the claims
// are released (their reservation and allocation cleared), deleted and
// gone before the namespace is deleted, then the Node; what cannot be
// removed is named with the command that removes it.
func TestCleanupAPI(t *testing.T) {
	t.Parallel()
	const ns, node = "dpkit-verify-abc", "dpkit-verify-abc"
	roles := []string{"claim-a", "claim-b", "claim-missing", "claim-shared"}
	// stuck makes a delete of resource only mark the object deleted, as
	// the API server does while a finalizer holds it (for a namespace:
	// until a namespace controller removes its content and finalizer).
	stuck := func(resource, name string) func(*fake.Clientset) {
		return func(c *fake.Clientset) {
			c.PrependReactor("delete", resource, func(a k8stesting.Action) (bool, runtime.Object, error) {
				d := a.(k8stesting.DeleteAction)
				if d.GetName() != name {
					return false, nil, nil
				}
				gvr := d.GetResource()
				obj, err := c.Tracker().Get(gvr, d.GetNamespace(), name)
				if err != nil {
					return true, nil, err
				}
				m, _ := obj.(metav1.Object)
				now := metav1.Now()
				m.SetDeletionTimestamp(&now)
				return true, nil, c.Tracker().Update(gvr, obj, d.GetNamespace())
			})
		}
	}
	for _, tc := range []struct {
		name   string
		claims []runtime.Object
		setup  func(*fake.Clientset)
		left   []string // the objects left, in order
		remove []string // a part of the command for each
	}{
		{"everything goes", nil, nil, nil, nil},
		{"no namespace controller", nil, stuck("namespaces", ns),
			[]string{"Namespace " + ns},
			[]string{`kubectl replace --raw /api/v1/namespaces/` + ns + `/finalize`}},
		{"a slow namespace controller", nil, func(c *fake.Clientset) {
			// kube-controller-manager holds its Lease; its namespace
			// controller removes the namespace a second after it was
			// deleted, past the call timeout.
			stuck("namespaces", ns)(c)
			now, d := metav1.NewMicroTime(time.Now()), int32(15)
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-controller-manager"},
				Spec: coordinationv1.LeaseSpec{RenewTime: &now, LeaseDurationSeconds: &d}}
			if err := c.Tracker().Add(lease); err != nil {
				t.Fatal(err)
			}
			goneAfter(c, ns, time.Second)
		}, nil, nil},
		{"a slow namespace controller without leader election", nil, func(c *fake.Clientset) {
			// kube-controller-manager put the ServiceAccount default in
			// the namespace; its namespace controller removes the
			// namespace a second after it was deleted.
			stuck("namespaces", ns)(c)
			if err := c.Tracker().Add(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}); err != nil {
				t.Fatal(err)
			}
			goneAfter(c, ns, time.Second)
		}, nil, nil},
		{"a claim someone else holds", []runtime.Object{reservedClaim(ns, "claim-b", "example.com/hold")}, stuck("resourceclaims", "claim-b"),
			[]string{"ResourceClaim " + ns + "/claim-b"},
			[]string{`kubectl -n ` + ns + ` patch resourceclaim claim-b --type merge -p '{"metadata":{"finalizers":null}}'; kubectl -n ` + ns + ` delete resourceclaim claim-b`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := []runtime.Object{
				&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}},
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
			}
			for _, role := range roles {
				i := slices.IndexFunc(tc.claims, func(o runtime.Object) bool { return o.(*resourcev1.ResourceClaim).Name == role })
				if i >= 0 {
					objs = append(objs, tc.claims[i])
				} else {
					objs = append(objs, reservedClaim(ns, role))
				}
			}
			client := fake.NewClientset(objs...)
			if tc.setup != nil {
				tc.setup(client)
			}
			r := &run{cfg: verify.DRAConfig{CallTimeout: 300 * time.Millisecond}.WithDefaults(), log: slog.New(slog.DiscardHandler),
				client: client, node: node, ns: ns, nodeCreated: true, nsCreated: true, created: roles}
			left := r.cleanupAPI()

			var got []string
			for i, l := range left {
				got = append(got, l.object)
				if i < len(tc.remove) && !strings.Contains(l.remove, tc.remove[i]) {
					t.Errorf("%s: remove with %q, want it to contain %q", l.object, l.remove, tc.remove[i])
				}
			}
			if !slices.Equal(got, tc.left) {
				t.Errorf("left %q, want %q", got, tc.left)
			}

			// The order: each claim released before it is deleted, every
			// claim deleted before the namespace, the ResourceSlices
			// and the namespace before the Node.
			var order []string
			for _, a := range client.Actions() {
				verb, res := a.GetVerb(), a.GetResource().Resource
				if verb == "get" || verb == "list" {
					continue
				}
				s := verb + " " + res
				if a.GetSubresource() != "" {
					s += "/" + a.GetSubresource()
				}
				switch a := a.(type) {
				case k8stesting.DeleteAction:
					s += " " + a.GetName()
				case k8stesting.UpdateAction:
					s += " " + a.GetObject().(metav1.Object).GetName()
				}
				if dc, ok := a.(k8stesting.DeleteCollectionAction); ok {
					s += " " + dc.GetListRestrictions().Fields.String()
				}
				order = append(order, s)
			}
			var want []string
			for _, role := range roles {
				want = append(want, "update resourceclaims/status "+role, "delete resourceclaims "+role)
			}
			want = append(want, "delete-collection resourceslices spec.nodeName="+node, "delete namespaces "+ns, "delete nodes "+node)
			if !slices.Equal(order, want) {
				t.Errorf("API calls:\n  %s\nwant:\n  %s", strings.Join(order, "\n  "), strings.Join(want, "\n  "))
			}
			for _, role := range roles {
				c, err := client.ResourceV1().ResourceClaims(ns).Get(context.Background(), role, metav1.GetOptions{})
				if err == nil && (c.Status.Allocation != nil || len(c.Status.ReservedFor) > 0) {
					t.Errorf("claim %s is left reserved: %+v", role, c.Status)
				}
			}
		})
	}
}

// TestKubeletLogsAreDebug: what the emulated kubelet logs, whatever its
// level, is the run's DEBUG, with its own level kept.
func TestKubeletLogsAreDebug(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	log := kubeletLogger(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "pluginwatcher"))
	log.Warn("Cannot send registration status to plugin", "err", "connection reset by peer")
	log.Info("Registered DRA plugin")
	if b.Len() != 0 {
		t.Errorf("logged at INFO and above:\n%s", b.String())
	}
	b.Reset()
	log = kubeletLogger(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})).With("component", "pluginwatcher"))
	log.Warn("Cannot send registration status to plugin", "err", "connection reset by peer")
	if want := `level=DEBUG msg="Cannot send registration status to plugin" component=pluginwatcher kubeletLevel=WARN err="connection reset by peer"`; !strings.Contains(b.String(), want) {
		t.Errorf("logged %q, want %q", b.String(), want)
	}
}

// goneAfter makes namespace ns go d after it was first read deleted, as a
// namespace controller removes it.
func goneAfter(c *fake.Clientset, ns string, d time.Duration) {
	var deleted time.Time
	c.PrependReactor("get", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := c.Tracker().Get(a.GetResource(), "", ns)
		if err != nil || obj.(metav1.Object).GetDeletionTimestamp() == nil {
			return false, nil, nil
		}
		if deleted.IsZero() {
			deleted = time.Now()
		}
		if time.Since(deleted) > d {
			return true, nil, c.Tracker().Delete(a.GetResource(), "", ns)
		}
		return false, nil, nil
	})
}
