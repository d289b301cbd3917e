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
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

const (
	testRun  = "abc123"
	testName = "dpkit-verify-" + testRun // the run's Node and Namespace
)

// runMeta is the metadata of an object of run id; uid "" is name's.
func runMeta(id, namespace, name string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Namespace: namespace, Name: name, UID: types.UID("uid-" + namespace + "-" + name)}
	if id != "" {
		m.Labels = map[string]string{RunLabel: id}
	}
	return m
}

// reservedClaim is a claim as the run writes it: labelled, allocated and
// reserved for verify's pod, which never exists.
func reservedClaim(ns, name string, finalizers ...string) *resourcev1.ResourceClaim {
	m := runMeta(testRun, ns, name)
	m.Finalizers = finalizers
	return &resourcev1.ResourceClaim{
		ObjectMeta: m,
		Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
				Request: "req", Driver: "dev.example.com", Pool: "node", Device: "dev-0",
			}}}},
			ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "dpkit-verify", UID: "dpkit-verify-pod-x"}},
		},
	}
}

// slice is a ResourceSlice for node nodeName, owned by the Node of UID
// owner ("": none).
func slice(name, nodeName string, owner types.UID) *resourcev1.ResourceSlice {
	s := &resourcev1.ResourceSlice{ObjectMeta: runMeta("", "", name), Spec: resourcev1.ResourceSliceSpec{Driver: "dev.example.com", NodeName: ptr.To(nodeName)}}
	if owner != "" {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: nodeName, UID: owner}}
	}
	return s
}

// runObjects are what a run creates, of run id, and the driver's slice.
func runObjects(id string) []runtime.Object {
	name := "dpkit-verify-" + id
	objs := []runtime.Object{
		&corev1.Node{ObjectMeta: runMeta(id, "", name)},
		&corev1.Namespace{ObjectMeta: runMeta(id, "", name), Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{corev1.FinalizerKubernetes}}},
		&corev1.ServiceAccount{ObjectMeta: runMeta(id, name, driverServiceAccount)},
		&rbacv1.ClusterRole{ObjectMeta: runMeta(id, "", name+":dpkit-dra")},
		&rbacv1.ClusterRoleBinding{ObjectMeta: runMeta(id, "", name+":dpkit-dra")},
		&rbacv1.Role{ObjectMeta: runMeta(id, name, "leases")},
		&rbacv1.RoleBinding{ObjectMeta: runMeta(id, name, "leases")},
		slice(name+"-slice", name, runMeta(id, "", name).UID),
	}
	for _, role := range []string{"claim-a", "claim-b"} {
		c := reservedClaim(name, role)
		c.Labels[RunLabel] = id
		objs = append(objs, c)
	}
	return objs
}

// apiServer makes the fake clientset keep what the API server keeps: a
// delete with a UID precondition of an object that is not that UID is a
// conflict; a deleted namespace only gets a deletion timestamp until it
// is finalized (no finalizers left).
func apiServer(t *testing.T, c *fake.Clientset) {
	t.Helper()
	c.PrependReactor("delete", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		d := a.(k8stesting.DeleteActionImpl)
		obj, err := c.Tracker().Get(d.GetResource(), d.GetNamespace(), d.GetName())
		if err != nil {
			return true, nil, err
		}
		m, _ := meta.Accessor(obj)
		if p := d.DeleteOptions.Preconditions; p != nil && p.UID != nil && *p.UID != m.GetUID() {
			return true, nil, apierrors.NewConflict(d.GetResource().GroupResource(), d.GetName(), errPrecondition)
		}
		if d.GetResource().Resource != "namespaces" {
			return false, nil, nil
		}
		now := metav1.Now()
		m.SetDeletionTimestamp(&now)
		return true, nil, c.Tracker().Update(d.GetResource(), obj, "")
	})
	c.PrependReactor("create", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "finalize" {
			return false, nil, nil
		}
		ns := a.(k8stesting.CreateAction).GetObject().(*corev1.Namespace)
		gvr := corev1.SchemeGroupVersion.WithResource("namespaces")
		if len(ns.Spec.Finalizers) == 0 && ns.DeletionTimestamp != nil && len(ns.Finalizers) == 0 {
			return true, ns, c.Tracker().Delete(gvr, "", ns.Name)
		}
		return true, ns, c.Tracker().Update(gvr, ns, "")
	})
}

var errPrecondition = errorString("Precondition failed: UID in precondition does not match the UID of the object")

type errorString string

func (e errorString) Error() string { return string(e) }

// fakeContent is namespaceContent over the fake clientset, for the kinds
// the tests put in namespaces.
type fakeContent struct{ c *fake.Clientset }

var contentKinds = []schema.GroupVersionKind{
	corev1.SchemeGroupVersion.WithKind("ConfigMap"), corev1.SchemeGroupVersion.WithKind("ServiceAccount"),
	resourcev1.SchemeGroupVersion.WithKind("ResourceClaim"), rbacv1.SchemeGroupVersion.WithKind("Role"),
	rbacv1.SchemeGroupVersion.WithKind("RoleBinding"),
}

func (f fakeContent) list(_ context.Context, ns string) ([]nsObject, bool, error) {
	var out []nsObject
	for _, gvk := range contentKinds {
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		l, err := f.c.Tracker().List(gvr, gvk, ns)
		if err != nil {
			return nil, false, err
		}
		items, _ := meta.ExtractList(l)
		for _, it := range items {
			m, _ := meta.Accessor(it)
			out = append(out, nsObject{gvr: gvr, kind: gvk.Kind, namespace: ns, name: m.GetName(), uid: m.GetUID(), labels: m.GetLabels()})
		}
	}
	return out, true, nil
}

func (f fakeContent) delete(ctx context.Context, o nsObject) error {
	a := k8stesting.NewDeleteActionWithOptions(o.gvr, o.namespace, o.name, uidPrecondition(o.uid))
	_, err := f.c.Invokes(a, nil)
	return err
}

// calls lists the changes the fake clientset was asked for.
func calls(c *fake.Clientset) []string {
	var out []string
	for _, a := range c.Actions() {
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
		case interface{ GetObject() runtime.Object }: // create, update
			s += " " + a.GetObject().(metav1.Object).GetName()
		}
		out = append(out, s)
	}
	return out
}

// left lists the objects the fake clientset holds, as "Kind ns/name".
func left(t *testing.T, c *fake.Clientset) []string {
	t.Helper()
	var out []string
	for _, gvk := range append(slices.Clone(contentKinds),
		corev1.SchemeGroupVersion.WithKind("Node"), corev1.SchemeGroupVersion.WithKind("Namespace"),
		rbacv1.SchemeGroupVersion.WithKind("ClusterRole"), rbacv1.SchemeGroupVersion.WithKind("ClusterRoleBinding"),
		resourcev1.SchemeGroupVersion.WithKind("ResourceSlice")) {
		gvr, _ := meta.UnsafeGuessKindToResource(gvk)
		l, err := c.Tracker().List(gvr, gvk, "")
		if err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(l)
		for _, it := range items {
			m, _ := meta.Accessor(it)
			name := m.GetName()
			if m.GetNamespace() != "" {
				name = m.GetNamespace() + "/" + name
			}
			out = append(out, gvk.Kind+" "+name)
		}
	}
	slices.Sort(out)
	return out
}

func newSweeper(c *fake.Clientset) *sweeper {
	return &sweeper{client: c, content: fakeContent{c}, log: slog.New(slog.DiscardHandler), timeout: 300 * time.Millisecond}
}

// TestSweepDeletesByLabelOnly: clean-up removes every object of its run
// and nothing else: not another run's, not an object without the label,
// not one of the same name made by someone else after it was listed (the
// UID precondition), not a ResourceSlice of another node. The driver's
// slices go by the run's Node's name and, for a Node already gone, by
// its UID as their owner.
func TestSweepDeletesByLabelOnly(t *testing.T) {
	t.Parallel()
	objs := runObjects(testRun)
	objs = append(objs, runObjects("other1")...)
	objs = append(objs,
		// Someone else's, of the names verify uses.
		&corev1.Node{ObjectMeta: runMeta("", "", "dpkit-verify-zzz999")},
		&rbacv1.ClusterRole{ObjectMeta: runMeta("", "", "dpkit-verify-zzz999:dpkit-dra")},
		&corev1.ConfigMap{ObjectMeta: runMeta("", "default", "dpkit-verify-"+testRun)},
		slice("someone-elses", "real-node", "uid-real-node"),
		// The driver's slice of the run's first Node, gone (its UID
		// in the run record).
		slice("of-a-gone-node", "dpkit-verify-gone", "uid-gone-node"),
	)
	c := fake.NewClientset(objs...)
	apiServer(t, c)
	// After the run's ClusterRole is listed, someone deletes it and makes
	// one of the same name.
	c.PrependReactor("list", "clusterroles", func(k8stesting.Action) (bool, runtime.Object, error) {
		gvr := rbacv1.SchemeGroupVersion.WithResource("clusterroles")
		l, err := c.Tracker().List(gvr, rbacv1.SchemeGroupVersion.WithKind("ClusterRole"), "")
		if err != nil {
			return true, nil, err
		}
		name := testName + ":dpkit-dra"
		if err := c.Tracker().Delete(gvr, "", name); err == nil {
			if err := c.Tracker().Add(&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "someone-elses"}}); err != nil {
				t.Error(err)
			}
		}
		out := &rbacv1.ClusterRoleList{}
		for _, o := range l.(*rbacv1.ClusterRoleList).Items {
			if o.Labels[RunLabel] == testRun {
				out.Items = append(out.Items, o)
			}
		}
		return true, out, nil
	})
	if l := newSweeper(c).sweep(testRun, "uid-gone-node", runMeta(testRun, "", testName).UID); len(l) > 0 {
		t.Errorf("left %+v, want nothing", l)
	}
	want := []string{
		"ClusterRole dpkit-verify-abc123:dpkit-dra", // someone else's now
		"ClusterRole dpkit-verify-other1:dpkit-dra",
		"ClusterRole dpkit-verify-zzz999:dpkit-dra",
		"ClusterRoleBinding dpkit-verify-other1:dpkit-dra",
		"ConfigMap default/dpkit-verify-abc123",
		"Namespace dpkit-verify-other1",
		"Node dpkit-verify-other1",
		"Node dpkit-verify-zzz999",
		"ResourceClaim dpkit-verify-other1/claim-a",
		"ResourceClaim dpkit-verify-other1/claim-b",
		"ResourceSlice dpkit-verify-other1-slice",
		"ResourceSlice someone-elses",
		"Role dpkit-verify-other1/leases",
		"RoleBinding dpkit-verify-other1/leases",
		"ServiceAccount dpkit-verify-other1/dpkit-verify-driver",
	}
	if got := left(t, c); !slices.Equal(got, want) {
		t.Errorf("left on the API server:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, a := range c.Actions() {
		if d, ok := a.(k8stesting.DeleteActionImpl); ok && (d.DeleteOptions.Preconditions == nil || d.DeleteOptions.Preconditions.UID == nil) {
			t.Errorf("delete %s %s without a UID precondition", d.GetResource().Resource, d.GetName())
		}
	}
}

// TestSweepOrder checks how a run's objects go: each claim released
// before it is deleted, every claim deleted before the namespace, the
// ResourceSlices, the RBAC and the ServiceAccount before the namespace,
// the namespace before the Node; the namespace, which only a namespace
// controller removes, is finalized by verify when none has removed it;
// what cannot be removed is named with the command that removes it.
func TestSweepOrder(t *testing.T) {
	t.Parallel()
	controller := func(c *fake.Clientset) {
		// kube-controller-manager holds its Lease and put its
		// ServiceAccount and ConfigMap in the namespace.
		now, d := metav1.NewMicroTime(time.Now()), int32(15)
		for _, o := range []runtime.Object{
			&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-controller-manager"},
				Spec: coordinationv1.LeaseSpec{RenewTime: &now, LeaseDurationSeconds: &d}},
			&corev1.ServiceAccount{ObjectMeta: runMeta("", testName, "default")},
			&corev1.ConfigMap{ObjectMeta: runMeta("", testName, "kube-root-ca.crt")},
		} {
			if err := c.Tracker().Add(o); err != nil {
				t.Fatal(err)
			}
		}
	}
	claims := []string{"update resourceclaims/status claim-a", "delete resourceclaims claim-a", "update resourceclaims/status claim-b", "delete resourceclaims claim-b"}
	access := []string{"delete resourceslices " + testName + "-slice",
		"delete clusterrolebindings " + testName + ":dpkit-dra", "delete rolebindings leases",
		"delete clusterroles " + testName + ":dpkit-dra", "delete roles leases", "delete serviceaccounts " + driverServiceAccount}
	for _, tc := range []struct {
		name   string
		setup  func(*fake.Clientset)
		calls  []string
		left   []string // the objects left, in order
		remove []string // a part of the command for each
	}{
		{"no namespace controller", nil,
			append(append(slices.Clone(claims), access...), "delete namespaces "+testName, "create namespaces/finalize "+testName, "delete nodes "+testName), nil, nil},
		{"a namespace controller", func(c *fake.Clientset) {
			controller(c)
			goneAfter(c, testName, 0)
		}, append(append(slices.Clone(claims), access...), "delete namespaces "+testName, "delete nodes "+testName), nil, nil},
		{"a slow namespace controller", func(c *fake.Clientset) {
			// It would remove the namespace a second after it was
			// deleted, past the call timeout: verify does its work.
			controller(c)
			goneAfter(c, testName, time.Second)
		}, append(append(slices.Clone(claims), access...), "delete namespaces "+testName,
			"delete configmaps kube-root-ca.crt", "delete serviceaccounts default", "create namespaces/finalize "+testName, "delete nodes "+testName), nil, nil},
		{"someone else's object in the namespace", func(c *fake.Clientset) {
			if err := c.Tracker().Add(&corev1.ConfigMap{ObjectMeta: runMeta("", testName, "someone-elses")}); err != nil {
				t.Fatal(err)
			}
		}, append(append(slices.Clone(claims), access...), "delete nodes "+testName),
			[]string{"Namespace " + testName}, []string{"kubectl delete namespace " + testName + ", once they are not needed"}},
		{"no right to finalize", func(c *fake.Clientset) {
			c.PrependReactor("create", "namespaces", func(a k8stesting.Action) (bool, runtime.Object, error) {
				return a.GetSubresource() == "finalize", nil, apierrors.NewForbidden(corev1.Resource("namespaces/finalize"), testName, errPrecondition)
			})
		}, append(append(slices.Clone(claims), access...), "delete namespaces "+testName, "create namespaces/finalize "+testName, "delete nodes "+testName),
			[]string{"Namespace " + testName}, []string{`kubectl replace --raw /api/v1/namespaces/` + testName + `/finalize`}},
		{"a claim someone else holds", func(c *fake.Clientset) {
			gvr := resourcev1.SchemeGroupVersion.WithResource("resourceclaims")
			claim := reservedClaim(testName, "claim-b", "example.com/hold")
			if err := c.Tracker().Update(gvr, claim, testName); err != nil {
				t.Fatal(err)
			}
			c.PrependReactor("delete", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
				obj, err := c.Tracker().Get(gvr, testName, a.(k8stesting.DeleteAction).GetName())
				if err != nil || len(obj.(metav1.Object).GetFinalizers()) == 0 {
					return false, nil, nil
				}
				now := metav1.Now()
				obj.(metav1.Object).SetDeletionTimestamp(&now)
				return true, nil, c.Tracker().Update(gvr, obj, testName)
			})
		}, append(append(slices.Clone(claims), access...), "delete namespaces "+testName, "delete resourceclaims claim-b", "delete nodes "+testName),
			[]string{"ResourceClaim " + testName + "/claim-b", "Namespace " + testName},
			[]string{`kubectl -n ` + testName + ` patch resourceclaim claim-b --type merge -p '{"metadata":{"finalizers":null}}'; kubectl -n ` + testName + ` delete resourceclaim claim-b`,
				"once it holds nothing: echo"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := fake.NewClientset(runObjects(testRun)...)
			apiServer(t, c)
			if tc.setup != nil {
				tc.setup(c)
			}
			left := newSweeper(c).sweep(testRun)
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
			if got := calls(c); !slices.Equal(got, tc.calls) {
				t.Errorf("API calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.calls, "\n  "))
			}
			for _, role := range []string{"claim-a", "claim-b"} {
				cl, err := c.ResourceV1().ResourceClaims(testName).Get(context.Background(), role, metav1.GetOptions{})
				if err == nil && (cl.Status.Allocation != nil || len(cl.Status.ReservedFor) > 0) {
					t.Errorf("claim %s is left reserved: %+v", role, cl.Status)
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
		if time.Since(deleted) >= d {
			if err := c.Tracker().Delete(a.GetResource(), "", ns); err != nil {
				return true, nil, err
			}
			return true, nil, apierrors.NewNotFound(a.GetResource().GroupResource(), ns)
		}
		return false, nil, nil
	})
}

// A slice a driver published for the run's Node by node selector is the
// run's only when it names that Node alone; one selecting by labels, for
// all nodes, or naming another node too is left alone.
func TestSelectsOnly(t *testing.T) {
	names := map[string]bool{"dpkit-verify-abc": true}
	byName := func(values ...string) *corev1.NodeSelector {
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
			{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: values}}}}}
	}
	byLabel := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{"dpkit-verify-abc"}}}}}}
	tests := []struct {
		name string
		spec resourcev1.ResourceSliceSpec
		want bool
	}{
		{"selector naming the run's Node", resourcev1.ResourceSliceSpec{NodeSelector: byName("dpkit-verify-abc")}, true},
		{"selector naming another node too", resourcev1.ResourceSliceSpec{NodeSelector: byName("dpkit-verify-abc", "worker-1")}, false},
		{"selector by labels", resourcev1.ResourceSliceSpec{NodeSelector: byLabel}, false},
		{"all nodes", resourcev1.ResourceSliceSpec{AllNodes: ptr.To(true)}, false},
		{"per device, each naming the run's Node", resourcev1.ResourceSliceSpec{PerDeviceNodeSelection: ptr.To(true), Devices: []resourcev1.Device{
			{Name: "a", NodeName: ptr.To("dpkit-verify-abc")}, {Name: "b", NodeSelector: byName("dpkit-verify-abc")}}}, true},
		{"per device, one for all nodes", resourcev1.ResourceSliceSpec{PerDeviceNodeSelection: ptr.To(true), Devices: []resourcev1.Device{
			{Name: "a", NodeName: ptr.To("dpkit-verify-abc")}, {Name: "b", AllNodes: ptr.To(true)}}}, false},
		{"per device, no devices", resourcev1.ResourceSliceSpec{PerDeviceNodeSelection: ptr.To(true)}, false},
	}
	for _, tt := range tests {
		s := &resourcev1.ResourceSlice{Spec: tt.spec}
		if got := selectsOnly(s, names); got != tt.want {
			t.Errorf("%s: selectsOnly = %t, want %t", tt.name, got, tt.want)
		}
	}
}
