package draverify

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// The run's namespace. Only a namespace controller (kube-controller-
// manager's) removes a deleted namespace, after what it holds; a control
// plane without one keeps it Terminating for ever, and one that is slow
// keeps it a while. So verify deletes its namespace only when nothing in
// it is someone else's, waits for a namespace controller when one runs
// (namespaceControllerWait), and, when none has removed it by then, does
// what the controller would: deletes what is left in it (its own objects,
// kube-controller-manager's ServiceAccount default and ConfigMap
// kube-root-ca.crt, events) and finalizes it.

// namespaceControllerWait bounds the wait for a namespace controller: on
// an idle control plane it removes an emptied namespace in about 5s (its
// first pass finds the ServiceAccount and ConfigMap that other
// controllers put back, and it tries again a second or so later); longer,
// it is backing off after errors, for up to a minute, and verify finishes
// the namespace itself.
const namespaceControllerWait = 15 * time.Second

// namespaceContent lists and deletes what a namespace holds, of every
// kind the API server serves.
type namespaceContent interface {
	// list returns the objects in namespace ns; complete is false when
	// some API groups could not be discovered.
	list(ctx context.Context, ns string) (objs []nsObject, complete bool, err error)
	delete(ctx context.Context, o nsObject) error
}

// nsObject is an object in a namespace.
type nsObject struct {
	gvr             schema.GroupVersionResource
	kind            string
	namespace, name string
	uid             types.UID
	labels          map[string]string
}

func (o nsObject) String() string { return o.kind + " " + o.name }

// housekeeping tells whether o is the run's (id), or what a cluster puts
// in every namespace: kube-controller-manager's ServiceAccount default
// and ConfigMap kube-root-ca.crt, and events.
func (o nsObject) housekeeping(id string) bool {
	switch {
	case o.labels[RunLabel] == id:
		return true
	case o.gvr.Resource == "events":
		return true
	case o.gvr.Group == "" && o.gvr.Resource == "serviceaccounts" && o.name == "default":
		return true
	case o.gvr.Group == "" && o.gvr.Resource == "configmaps" && o.name == "kube-root-ca.crt":
		return true
	}
	return false
}

// foreign names the objects of objs that are someone else's.
func foreign(objs []nsObject, id string) []string {
	var out []string
	for _, o := range objs {
		if !o.housekeeping(id) {
			out = append(out, o.String())
		}
	}
	slices.Sort(out)
	return out
}

// apiContent is namespaceContent through discovery and the metadata
// client.
type apiContent struct {
	disc discovery.DiscoveryInterface
	meta metadata.Interface
}

// newAPIContent is apiContent for the API server of rc. A namespace is
// listed kind by kind (some 40 lists), so its clients have a rate limit
// above client-go's default (5 a second), and they keep the API server's
// warnings about deprecated kinds (Endpoints) to themselves: they are
// no finding.
func newAPIContent(rc *rest.Config) (apiContent, error) {
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = 200, 400
	rc.WarningHandler = rest.NoWarnings{}
	disc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return apiContent{}, err
	}
	meta, err := metadata.NewForConfig(rc)
	if err != nil {
		return apiContent{}, err
	}
	return apiContent{disc, meta}, nil
}

func (c apiContent) list(ctx context.Context, ns string) ([]nsObject, bool, error) {
	lists, err := c.disc.ServerPreferredNamespacedResources()
	complete := err == nil
	if err != nil && !discovery.IsGroupDiscoveryFailedError(err) {
		return nil, false, err
	}
	var out []nsObject
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			complete = false
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "delete") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			ol, err := c.meta.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
			switch {
			case apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err):
				continue
			case err != nil:
				return nil, false, fmt.Errorf("list %s in %s: %w", gvr.GroupResource(), ns, err)
			}
			for _, o := range ol.Items {
				out = append(out, nsObject{gvr: gvr, kind: r.Kind, namespace: ns, name: o.Name, uid: o.UID, labels: o.Labels})
			}
		}
	}
	return out, complete, nil
}

func (c apiContent) delete(ctx context.Context, o nsObject) error {
	return c.meta.Resource(o.gvr).Namespace(o.namespace).Delete(ctx, o.name, uidPrecondition(o.uid))
}

// deleteNamespace deletes the run's namespace and waits until it is gone.
func (s *sweeper) deleteNamespace(id string, ns *corev1.Namespace) *leftover {
	if ns.DeletionTimestamp == nil {
		ctx, cancel := s.call()
		objs, _, err := s.content.list(ctx, ns.Name)
		cancel()
		switch f := foreign(objs, id); {
		case err != nil:
			return &leftover{"Namespace " + ns.Name, "not deleted: verify cannot tell whether it holds someone else's objects: " + err.Error(),
				"kubectl delete namespace " + ns.Name + ", once nothing in it is needed"}
		case len(f) > 0:
			return &leftover{"Namespace " + ns.Name, "not deleted: it holds objects verify did not create: " + strings.Join(f, ", "),
				"kubectl delete namespace " + ns.Name + ", once they are not needed"}
		}
	}
	// Looked for before the namespace goes: what kube-controller-manager
	// puts in every namespace.
	controller := s.controllerManagerRuns(ns.Name)
	ctx, cancel := s.call()
	err := s.client.CoreV1().Namespaces().Delete(ctx, ns.Name, uidPrecondition(ns.UID))
	cancel()
	switch {
	case gone(err):
		return nil
	case err != nil:
		return &leftover{"Namespace " + ns.Name, err.Error(), "kubectl delete namespace " + ns.Name}
	}
	start := time.Now()
	if controller {
		ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(s.controllerWait, s.timeout))
		ok := s.waitGone(ctx, ns)
		cancel()
		if ok {
			s.log.Debug("The run's namespace is gone", "namespace", ns.Name, "after", time.Since(start), "by", "the namespace controller")
			s.done("Namespace " + ns.Name)
			return nil
		}
	}
	l := s.finalizeNamespace(id, ns, controller)
	if l == nil {
		s.log.Debug("The run's namespace is gone", "namespace", ns.Name, "after", time.Since(start), "by", "verify")
	}
	return l
}

// waitGone waits until ns is gone (or replaced).
func (s *sweeper) waitGone(ctx context.Context, ns *corev1.Namespace) bool {
	for {
		cur, err := s.client.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != ns.UID) {
			return true
		}
		if !sleep(ctx, 100*time.Millisecond) {
			return false
		}
	}
}

// finalizeNamespace does what a namespace controller does with the run's
// deleted namespace: it deletes what the namespace still holds, all of it
// the run's or housekeeping, and removes the namespace's finalizer.
func (s *sweeper) finalizeNamespace(id string, ns *corev1.Namespace, controller bool) *leftover {
	ctx, cancel := s.call()
	defer cancel()
	namespaces := s.client.CoreV1().Namespaces()
	finalize := fmt.Sprintf(`echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"},"spec":{"finalizers":[]}}' | kubectl replace --raw /api/v1/namespaces/%s/finalize -f -`, ns.Name, ns.Name)
	stuck := func(why string) *leftover {
		if controller {
			why = "still Terminating after the namespace controller had " + cmp.Or(s.controllerWait, s.timeout).String() + " and verify could not finish it: " + why
		} else {
			why = "Terminating: no namespace controller runs to finish deleting it, and verify could not: " + why
		}
		return &leftover{"Namespace " + ns.Name, why, "kubectl get namespace " + ns.Name + " -o yaml (its conditions say what holds it); once it holds nothing: " + finalize}
	}
	objs, complete, err := s.content.list(ctx, ns.Name)
	switch f := foreign(objs, id); {
	case err != nil:
		return stuck("cannot list what it holds: " + err.Error())
	case !complete:
		return stuck("some API groups could not be discovered, so verify cannot tell that it is empty")
	case len(f) > 0:
		return stuck("it holds objects verify did not create: " + strings.Join(f, ", "))
	}
	for _, o := range objs {
		if err := s.content.delete(ctx, o); err != nil && !gone(err) {
			return stuck(fmt.Sprintf("delete %s: %v", o, err))
		}
	}
	if objs, _, err = s.content.list(ctx, ns.Name); err != nil || len(objs) > 0 {
		var what []string
		for _, o := range objs {
			what = append(what, o.String())
		}
		return stuck(fmt.Sprintf("still holds %s after they were deleted (finalizers?)%s", strings.Join(what, ", "), errSuffix(err)))
	}
	cur, err := namespaces.Get(ctx, ns.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || (err == nil && cur.UID != ns.UID):
		s.done("Namespace " + ns.Name)
		return nil
	case err != nil:
		return stuck(err.Error())
	}
	cur.Spec.Finalizers = nil
	if _, err := namespaces.Finalize(ctx, cur, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return stuck("finalize: " + err.Error())
	}
	if !s.waitGone(ctx, ns) {
		why := "still there after verify finalized it"
		if cur, err := namespaces.Get(context.Background(), ns.Name, metav1.GetOptions{}); err == nil && len(cur.Finalizers) > 0 {
			why += "; its finalizers: " + strings.Join(cur.Finalizers, ", ")
		}
		return stuck(why)
	}
	s.done("Namespace " + ns.Name)
	return nil
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// controllerManagerRuns reports whether a kube-controller-manager runs,
// whose namespace controller deletes namespaces: its serviceaccount and
// root-ca-cert-publisher controllers put the ServiceAccount "default" and
// the ConfigMap "kube-root-ca.crt" in namespace ns, or it holds its
// leader Lease.
func (s *sweeper) controllerManagerRuns(ns string) bool {
	ctx, cancel := s.call()
	defer cancel()
	if _, err := s.client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
		return true
	}
	if _, err := s.client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err == nil {
		return true
	}
	l, err := s.client.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, "kube-controller-manager", metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	// Twice the duration: the clocks of verify and the leader may differ.
	return time.Since(l.Spec.RenewTime.Time) < 2*time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
}
