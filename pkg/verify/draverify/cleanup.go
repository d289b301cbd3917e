package draverify

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// kubeletLogger is the logger of the emulated kubelet side (the DRA
// manager and the plugin watcher). What they log is how the run went, not
// a finding: the report has the findings. So every record is the run's
// DEBUG, whatever its level, which it keeps as kubeletLevel: a plugin
// watcher's WARN when the driver it restarts resets a connection is no
// failure of the run.
func kubeletLogger(log *slog.Logger) *slog.Logger { return slog.New(debugHandler{log.Handler()}) }

// debugHandler hands every record on at DEBUG.
type debugHandler struct{ next slog.Handler }

func (h debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return h.next.Enabled(ctx, slog.LevelDebug)
}

func (h debugHandler) Handle(ctx context.Context, r slog.Record) error {
	d := slog.NewRecord(r.Time, slog.LevelDebug, r.Message, r.PC)
	if r.Level != slog.LevelDebug {
		d.AddAttrs(slog.String("kubeletLevel", r.Level.String()))
	}
	r.Attrs(func(a slog.Attr) bool {
		d.AddAttrs(a)
		return true
	})
	return h.next.Handle(ctx, d)
}

func (h debugHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return debugHandler{h.next.WithAttrs(as)}
}

func (h debugHandler) WithGroup(name string) slog.Handler {
	return debugHandler{h.next.WithGroup(name)}
}

// leftover is an object of a run that clean-up could not remove, with
// why and the command that removes it.
type leftover struct {
	object, why, remove string
}

// sweeper removes the objects of runs from the API server. It finds them
// by RunLabel only and deletes each with a precondition on its UID, so an
// object of the same name that someone else made, before or while it
// works, stays. It removes them in the order a cluster would: verify
// creates no pod, its claims are reserved for a pod that never exists, so
// nothing else would drop the reservation (kube-controller-manager's
// resourceclaim controller drops those of pods that are gone); so first
// each claim's reservation and allocation are cleared, as that controller
// does once the pod is gone, and the claims deleted and waited for; then
// the ResourceSlices of the run's Node, the driver's RBAC and
// ServiceAccount, the Namespace (namespace.go) and the Node.
type sweeper struct {
	client  kubernetes.Interface
	content namespaceContent
	log     *slog.Logger
	// timeout bounds each call, and each wait for what was deleted;
	// controllerWait the wait for a namespace controller (0: timeout).
	timeout, controllerWait time.Duration
	// removed, when set, is told of each object removed.
	removed func(object string)
}

// call is a context for one call or wait.
func (s *sweeper) call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.timeout)
}

func (s *sweeper) done(object string) {
	s.log.Debug("Removed an object of a verify run", "object", object)
	if s.removed != nil {
		s.removed(object)
	}
}

// selector selects the objects of run id.
func selector(id string) string { return RunLabel + "=" + id }

// uidPrecondition deletes the object only if it is still the one of that
// UID.
func uidPrecondition(uid types.UID) metav1.DeleteOptions {
	return metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(uid))}
}

// gone tells whether a delete's error means the object is not there (or
// no longer the one listed: a precondition's conflict).
func gone(err error) bool {
	return apierrors.IsNotFound(err) || apierrors.IsConflict(err)
}

// sweep removes every object of run id and returns what it could not.
// nodeUIDs are the UIDs the run's Nodes had (the run record's): the
// driver's ResourceSlices name them as owner also once a Node is gone.
func (s *sweeper) sweep(id string, nodeUIDs ...types.UID) []leftover {
	left := s.deleteClaims(id)
	ctx, cancel := s.call()
	nodes, err := s.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: selector(id)})
	cancel()
	if err != nil {
		return append(left, leftover{"the Nodes of run " + id, err.Error(), "kubectl delete nodes -l " + selector(id)})
	}
	left = append(left, s.deleteSlices(nodes.Items, nodeUIDs)...)
	for _, k := range s.accessKinds() {
		left = append(left, s.deleteKind(id, k)...)
	}
	ctx, cancel = s.call()
	nss, err := s.client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{LabelSelector: selector(id)})
	cancel()
	if err != nil {
		left = append(left, leftover{"the Namespaces of run " + id, err.Error(), "kubectl delete namespaces -l " + selector(id)})
	} else {
		for _, ns := range nss.Items {
			if l := s.deleteNamespace(id, &ns); l != nil {
				left = append(left, *l)
			}
		}
	}
	for _, n := range nodes.Items {
		ctx, cancel := s.call()
		err := s.client.CoreV1().Nodes().Delete(ctx, n.Name, uidPrecondition(n.UID))
		cancel()
		switch {
		case err == nil:
			s.done("Node " + n.Name)
		case !gone(err):
			left = append(left, leftover{"Node " + n.Name, err.Error(), "kubectl delete node " + n.Name})
		}
	}
	return left
}

// kind is a kind of object a run creates, listed and deleted through the
// typed client.
type kind struct {
	name, resource string
	namespaced     bool
	list           func(context.Context, metav1.ListOptions) ([]metav1.Object, error)
	delete         func(ctx context.Context, namespace, name string, o metav1.DeleteOptions) error
}

// objects are items as metav1.Objects.
func objects[T any, PT interface {
	*T
	metav1.Object
}](items []T) []metav1.Object {
	out := make([]metav1.Object, len(items))
	for i := range items {
		out[i] = PT(&items[i])
	}
	return out
}

// accessKinds are the kinds of the driver's access: its RBAC and
// ServiceAccount, bindings first.
func (s *sweeper) accessKinds() []kind {
	rbac, core := s.client.RbacV1(), s.client.CoreV1()
	return []kind{
		{"ClusterRoleBinding", "clusterrolebindings", false,
			func(ctx context.Context, o metav1.ListOptions) ([]metav1.Object, error) {
				l, err := rbac.ClusterRoleBindings().List(ctx, o)
				if err != nil {
					return nil, err
				}
				return objects(l.Items), nil
			},
			func(ctx context.Context, _, name string, o metav1.DeleteOptions) error {
				return rbac.ClusterRoleBindings().Delete(ctx, name, o)
			}},
		{"RoleBinding", "rolebindings", true,
			func(ctx context.Context, o metav1.ListOptions) ([]metav1.Object, error) {
				l, err := rbac.RoleBindings("").List(ctx, o)
				if err != nil {
					return nil, err
				}
				return objects(l.Items), nil
			},
			func(ctx context.Context, ns, name string, o metav1.DeleteOptions) error {
				return rbac.RoleBindings(ns).Delete(ctx, name, o)
			}},
		{"ClusterRole", "clusterroles", false,
			func(ctx context.Context, o metav1.ListOptions) ([]metav1.Object, error) {
				l, err := rbac.ClusterRoles().List(ctx, o)
				if err != nil {
					return nil, err
				}
				return objects(l.Items), nil
			},
			func(ctx context.Context, _, name string, o metav1.DeleteOptions) error {
				return rbac.ClusterRoles().Delete(ctx, name, o)
			}},
		{"Role", "roles", true,
			func(ctx context.Context, o metav1.ListOptions) ([]metav1.Object, error) {
				l, err := rbac.Roles("").List(ctx, o)
				if err != nil {
					return nil, err
				}
				return objects(l.Items), nil
			},
			func(ctx context.Context, ns, name string, o metav1.DeleteOptions) error {
				return rbac.Roles(ns).Delete(ctx, name, o)
			}},
		{"ServiceAccount", "serviceaccounts", true,
			func(ctx context.Context, o metav1.ListOptions) ([]metav1.Object, error) {
				l, err := core.ServiceAccounts("").List(ctx, o)
				if err != nil {
					return nil, err
				}
				return objects(l.Items), nil
			},
			func(ctx context.Context, ns, name string, o metav1.DeleteOptions) error {
				return core.ServiceAccounts(ns).Delete(ctx, name, o)
			}},
	}
}

// deleteKind deletes the objects of kind k of run id.
func (s *sweeper) deleteKind(id string, k kind) []leftover {
	ctx, cancel := s.call()
	defer cancel()
	all := ""
	if k.namespaced {
		all = " -A"
	}
	objs, err := k.list(ctx, metav1.ListOptions{LabelSelector: selector(id)})
	if err != nil {
		return []leftover{{"the " + k.name + "s of run " + id, err.Error(), "kubectl delete " + k.resource + all + " -l " + selector(id)}}
	}
	var left []leftover
	for _, o := range objs {
		name := o.GetName()
		if o.GetNamespace() != "" {
			name = o.GetNamespace() + "/" + name
		}
		err := k.delete(ctx, o.GetNamespace(), o.GetName(), uidPrecondition(o.GetUID()))
		switch {
		case err == nil:
			s.done(k.name + " " + name)
		case !gone(err):
			ns := ""
			if o.GetNamespace() != "" {
				ns = " -n " + o.GetNamespace()
			}
			left = append(left, leftover{k.name + " " + name, err.Error(), "kubectl delete" + ns + " " + strings.ToLower(k.name) + " " + o.GetName()})
		}
	}
	return left
}

// deleteSlices deletes the ResourceSlices of the run's Nodes: those with
// the spec.nodeName of one of nodes, and those a Node of the run owns
// (nodeUIDs: also of a Node that is gone).
func (s *sweeper) deleteSlices(nodes []corev1.Node, nodeUIDs []types.UID) []leftover {
	ctx, cancel := s.call()
	defer cancel()
	owners := map[types.UID]bool{}
	names := map[string]bool{}
	var queries []string
	for _, n := range nodes {
		owners[n.UID], names[n.Name] = true, true
		queries = append(queries, resourcev1.ResourceSliceSelectorNodeName+"="+n.Name)
	}
	if len(nodes) > 0 {
		// Slices that select the run's Node by name (spec.nodeSelector,
		// spec.perDeviceNodeSelection) have no field to select them by.
		queries = []string{""}
	}
	for _, u := range nodeUIDs {
		if !owners[u] {
			// A Node of the run is gone: only the owner reference
			// names its slices.
			owners[u] = true
			queries = []string{""}
		}
	}
	var found []resourcev1.ResourceSlice
	seen := map[types.UID]bool{}
	for _, q := range queries {
		l, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: q})
		if err != nil {
			return []leftover{{"the ResourceSlices of the run's Node", err.Error(), "kubectl delete resourceslices --field-selector " + q}}
		}
		for _, sl := range l.Items {
			mine := sl.Spec.NodeName != nil && names[*sl.Spec.NodeName]
			mine = mine || selectsOnly(&sl, names)
			mine = mine || slices.ContainsFunc(sl.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Node" && owners[o.UID] })
			if mine && !seen[sl.UID] {
				seen[sl.UID] = true
				found = append(found, sl)
			}
		}
	}
	var left []leftover
	for _, sl := range found {
		err := s.client.ResourceV1().ResourceSlices().Delete(ctx, sl.Name, uidPrecondition(sl.UID))
		switch {
		case err == nil:
			s.done("ResourceSlice " + sl.Name)
		case !gone(err):
			left = append(left, leftover{"ResourceSlice " + sl.Name, err.Error(), "kubectl delete resourceslice " + sl.Name})
		}
	}
	return left
}

// selectsOnly tells whether s offers its devices to nodes of names alone,
// naming them (metadata.name in every node selector term, or each
// device's nodeName): a slice a driver published for a run's Node by node
// selector. A slice that selects by labels, or for all nodes, may be
// anyone's and is left alone.
func selectsOnly(s *resourcev1.ResourceSlice, names map[string]bool) bool {
	byName := func(sel *corev1.NodeSelector) bool {
		if sel == nil || len(sel.NodeSelectorTerms) == 0 {
			return false
		}
		for _, t := range sel.NodeSelectorTerms {
			ok := false
			for _, f := range t.MatchFields {
				if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn && len(f.Values) > 0 &&
					!slices.ContainsFunc(f.Values, func(v string) bool { return !names[v] }) {
					ok = true
				}
			}
			if !ok {
				return false
			}
		}
		return true
	}
	if s.Spec.NodeSelector != nil {
		return byName(s.Spec.NodeSelector)
	}
	if !ptr.Deref(s.Spec.PerDeviceNodeSelection, false) || len(s.Spec.Devices) == 0 {
		return false
	}
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		if !names[ptr.Deref(d.NodeName, "")] && !byName(d.NodeSelector) {
			return false
		}
	}
	return true
}

// deleteClaims releases and deletes the claims of run id, and waits until
// they are gone.
func (s *sweeper) deleteClaims(id string) []leftover {
	ctx, cancel := s.call()
	defer cancel()
	all := s.client.ResourceV1().ResourceClaims("")
	l, err := all.List(ctx, metav1.ListOptions{LabelSelector: selector(id)})
	if err != nil {
		return []leftover{{"the ResourceClaims of run " + id, err.Error(), "kubectl delete resourceclaims -A -l " + selector(id)}}
	}
	var left []leftover
	var deleted []resourcev1.ResourceClaim
	for _, c := range l.Items {
		claims := s.client.ResourceV1().ResourceClaims(c.Namespace)
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := claims.Get(ctx, c.Name, metav1.GetOptions{})
			switch {
			case err != nil:
				return err
			case cur.UID != c.UID:
				return apierrors.NewNotFound(resourcev1.Resource("resourceclaims"), c.Name)
			case len(cur.Status.ReservedFor) == 0 && cur.Status.Allocation == nil:
				return nil
			}
			cur.Status.ReservedFor, cur.Status.Allocation = nil, nil
			_, err = claims.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err == nil {
			err = claims.Delete(ctx, c.Name, uidPrecondition(c.UID))
		}
		switch {
		case gone(err):
		case err != nil:
			left = append(left, claimLeftover(&c, err.Error()))
		default:
			deleted = append(deleted, c)
		}
	}
	// A claim with a finalizer (someone else's) stays until it goes.
	for len(deleted) > 0 {
		l, err := all.List(ctx, metav1.ListOptions{LabelSelector: selector(id)})
		if err == nil {
			deleted = slices.DeleteFunc(deleted, func(c resourcev1.ResourceClaim) bool {
				if !slices.ContainsFunc(l.Items, func(o resourcev1.ResourceClaim) bool { return o.UID == c.UID }) {
					s.done("ResourceClaim " + c.Namespace + "/" + c.Name)
					return true
				}
				return false
			})
		}
		if len(deleted) == 0 || !sleep(ctx, 100*time.Millisecond) {
			break
		}
	}
	for _, c := range deleted {
		why := "still there after it was deleted"
		if cur, err := s.client.ResourceV1().ResourceClaims(c.Namespace).Get(context.Background(), c.Name, metav1.GetOptions{}); err == nil && len(cur.Finalizers) > 0 {
			why += "; its finalizers: " + strings.Join(cur.Finalizers, ", ")
		}
		left = append(left, claimLeftover(&c, why))
	}
	return left
}

func claimLeftover(c *resourcev1.ResourceClaim, why string) leftover {
	return leftover{"ResourceClaim " + c.Namespace + "/" + c.Name, why,
		fmt.Sprintf(`kubectl -n %s patch resourceclaim %s --type merge -p '{"metadata":{"finalizers":null}}'; kubectl -n %s delete resourceclaim %s`, c.Namespace, c.Name, c.Namespace, c.Name)}
}

// sleep waits d, or until ctx ends (false).
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
