package draverify

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
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

// leftover is an object of the run that cleanup could not remove.
type leftover struct {
	object, why, remove string
}

// cleanupAPI removes what the run wrote on the API server, in the order a
// cluster would, and returns what it could not remove. verify creates no
// pod: its claims are reserved for a pod that never exists, so nothing
// else would drop the reservation (kube-controller-manager's resourceclaim
// controller drops those of pods that are gone, and its namespace
// controller deletes what a deleted namespace holds; a control plane
// without it keeps both for ever). So first each claim's reservation and
// allocation are cleared, as that controller does once the pod is gone,
// and the claims deleted and waited for; then the ResourceSlices, the
// Namespace (waited for) and the Node.
func (r *run) cleanupAPI() []leftover {
	var left []leftover
	if r.nsCreated {
		left = append(left, r.deleteClaims()...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CallTimeout)
	defer cancel()
	if r.nodeCreated {
		selector := resourcev1.ResourceSliceSelectorNodeName + "=" + r.node
		err := r.client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: selector})
		if err != nil && !apierrors.IsNotFound(err) {
			left = append(left, leftover{"the ResourceSlices of node " + r.node, err.Error(),
				"kubectl delete resourceslices --field-selector " + selector})
		}
	}
	if r.nsCreated {
		if l := r.deleteNamespace(); l != nil {
			left = append(left, *l)
		}
	}
	if r.nodeCreated {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CallTimeout)
		defer cancel()
		if err := r.client.CoreV1().Nodes().Delete(ctx, r.node, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			left = append(left, leftover{"Node " + r.node, err.Error(), "kubectl delete node " + r.node})
		}
	}
	return left
}

// deleteClaims releases and deletes the claims the run created, and waits
// until they are gone.
func (r *run) deleteClaims() []leftover {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CallTimeout)
	defer cancel()
	claims := r.client.ResourceV1().ResourceClaims(r.ns)
	var left []leftover
	var deleted []string
	for _, name := range r.created {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := claims.Get(ctx, name, metav1.GetOptions{})
			if err != nil || (len(c.Status.ReservedFor) == 0 && c.Status.Allocation == nil) {
				return err
			}
			c.Status.ReservedFor, c.Status.Allocation = nil, nil
			_, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{})
			return err
		})
		if err == nil {
			err = claims.Delete(ctx, name, metav1.DeleteOptions{})
		}
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			left = append(left, r.claimLeftover(name, err.Error()))
		default:
			deleted = append(deleted, name)
		}
	}
	// A claim with a finalizer (someone else's) stays until it goes.
	for len(deleted) > 0 {
		l, err := claims.List(ctx, metav1.ListOptions{})
		if err == nil {
			deleted = slices.DeleteFunc(deleted, func(name string) bool {
				return !slices.ContainsFunc(l.Items, func(c resourcev1.ResourceClaim) bool { return c.Name == name })
			})
		}
		if len(deleted) == 0 || !sleep(ctx, 100*time.Millisecond) {
			break
		}
	}
	for _, name := range deleted {
		why := "still there after it was deleted"
		if c, err := claims.Get(context.Background(), name, metav1.GetOptions{}); err == nil && len(c.Finalizers) > 0 {
			why += "; its finalizers: " + strings.Join(c.Finalizers, ", ")
		}
		left = append(left, r.claimLeftover(name, why))
	}
	return left
}

func (r *run) claimLeftover(name, why string) leftover {
	return leftover{"ResourceClaim " + r.ns + "/" + name, why,
		fmt.Sprintf(`kubectl -n %s patch resourceclaim %s --type merge -p '{"metadata":{"finalizers":null}}'; kubectl -n %s delete resourceclaim %s`, r.ns, name, r.ns, name)}
}

// namespaceWait bounds the wait for a namespace controller to delete the
// run's namespace once verify has emptied it.
const namespaceWait = 30 * time.Second

// deleteNamespace deletes the run's namespace and waits until it is gone.
// Only a namespace controller removes a deleted namespace (after its
// content); a control plane without kube-controller-manager keeps it
// Terminating for ever. So it waits while a namespace controller works
// (conditions on the namespace, or controllerManagerRuns), up to
// namespaceWait, and reports the namespace left when none does or it
// cannot finish.
func (r *run) deleteNamespace() *leftover {
	// Looked for before the namespace goes: what kube-controller-manager
	// puts in every namespace.
	controller := r.controllerManagerRuns()
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CallTimeout)
	defer cancel()
	namespaces := r.client.CoreV1().Namespaces()
	err := namespaces.Delete(ctx, r.ns, metav1.DeleteOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return &leftover{"Namespace " + r.ns, err.Error(), "kubectl delete namespace " + r.ns}
	}
	start := time.Now()
	wait := r.cfg.CallTimeout
	for {
		ns, err := namespaces.Get(context.Background(), r.ns, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			r.log.Debug("The run's namespace is gone", "namespace", r.ns, "after", time.Since(start))
			return nil
		case err == nil && len(ns.Status.Conditions) > 0:
			controller = true
		}
		if time.Since(start) < wait {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if controller && wait < namespaceWait {
			wait = namespaceWait
			continue
		}
		switch {
		case err != nil:
			return &leftover{"Namespace " + r.ns, "deleted, but verify cannot tell whether it is gone: " + err.Error(), "kubectl delete namespace " + r.ns}
		case !controller:
			// Everything verify created in it is deleted: only the
			// namespace controller's finalizer holds it.
			return &leftover{"Namespace " + r.ns,
				"Terminating: no namespace controller runs to finish deleting it (no kube-controller-manager: nothing put its ServiceAccount default or ConfigMap kube-root-ca.crt in the namespace, and none holds its leader Lease); verify removed what it created in it",
				fmt.Sprintf(`run kube-controller-manager, or: echo '{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"%s"},"spec":{"finalizers":[]}}' | kubectl replace --raw /api/v1/namespaces/%s/finalize -f -`, r.ns, r.ns)}
		}
		var why []string
		for _, c := range ns.Status.Conditions {
			if c.Status == corev1.ConditionTrue {
				why = append(why, c.Message)
			}
		}
		sort.Strings(why)
		return &leftover{"Namespace " + r.ns, fmt.Sprintf("still Terminating %s after it was deleted: %s", namespaceWait, cmp.Or(strings.Join(why, "; "), "the namespace controller has not finished")),
			"kubectl get namespace " + r.ns + " -o yaml (its conditions say what holds it); kubectl api-resources --verbs=list --namespaced -o name | xargs -n 1 kubectl get --show-kind --ignore-not-found -n " + r.ns}
	}
}

// controllerManagerRuns reports whether a kube-controller-manager runs,
// whose namespace controller deletes namespaces: its serviceaccount and
// root-ca-cert-publisher controllers put the ServiceAccount "default" and
// the ConfigMap "kube-root-ca.crt" in the run's namespace, or it holds its
// leader Lease.
func (r *run) controllerManagerRuns() bool {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CallTimeout)
	defer cancel()
	if _, err := r.client.CoreV1().ServiceAccounts(r.ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
		return true
	}
	if _, err := r.client.CoreV1().ConfigMaps(r.ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{}); err == nil {
		return true
	}
	l, err := r.client.CoordinationV1().Leases(metav1.NamespaceSystem).Get(ctx, "kube-controller-manager", metav1.GetOptions{})
	if err != nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return false
	}
	// Twice the duration: the clocks of verify and the leader may differ.
	return time.Since(l.Spec.RenewTime.Time) < 2*time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
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
