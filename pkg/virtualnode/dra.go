package virtualnode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/ondemand"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// CDIDevicesEnv is the environment variable in which the process backend
// gives a container the CDI device IDs of the devices its ResourceClaims
// got (comma-separated, in the order of the container's claims), what the
// kubelet passes to the container runtime. It is set only for containers
// that use claims.
const CDIDevicesEnv = "DPKIT_CDI_DEVICES"

// draRetryPeriod is how often the claims of pods that could not be
// prepared are tried again besides when a DRA driver registers: the
// kubelet's pod worker back-off.
const draRetryPeriod = 10 * time.Second

// apiClaims reads ResourceClaims from the API server at the time a pod's
// claims are prepared, as the kubelet does (a GET per claim, no watch):
// the claim must be fresh (allocated and reserved for the pod), and a
// node identity may get the claims of its pods but not list every claim
// of the cluster.
type apiClaims struct{ client kubernetes.Interface }

func (c apiClaims) GetResourceClaim(ctx context.Context, namespace, name string) (*resourcev1.ResourceClaim, error) {
	return c.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// apiSlices wipes the node's ResourceSlices as the kubelet does: one
// DeleteCollection with the field selector spec.nodeName=<node> (and
// spec.driver=<driver> for one driver), which a node identity may do.
type apiSlices struct {
	client kubernetes.Interface
	node   string
}

func (s apiSlices) WipeResourceSlices(ctx context.Context, driver string) error {
	sel := fields.Set{resourcev1.ResourceSliceSelectorNodeName: s.node}
	if driver != "" {
		sel[resourcev1.ResourceSliceSelectorDriver] = driver
	}
	err := s.client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel.String()})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("delete ResourceSlices %s: %w", sel, err)
	}
	return nil
}

// draQueue holds the pods the DRA loop works for: pods admitted whose
// claims could not be prepared yet (they wait, Pending, and start once
// prepared), and pods that ended whose claims must be unprepared. The
// loop runs only while it has work (ondemand.Loop): a node with no pod
// waiting on claims has no goroutine for it, one fewer for each of the
// thousand idle nodes of a process.
type draQueue struct {
	mu        sync.Mutex
	waiting   map[types.UID]*corev1.Pod
	unprepare map[types.UID]*corev1.Pod
	kick      chan struct{} // one slot: the loop has work
	loop      ondemand.Loop
}

func (q *draQueue) init() {
	q.waiting = map[types.UID]*corev1.Pod{}
	q.unprepare = map[types.UID]*corev1.Pod{}
	q.kick = make(chan struct{}, 1)
}

func (q *draQueue) wake() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// hasWork says whether a pod waits or has claims to unprepare.
func (q *draQueue) hasWork() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)+len(q.unprepare) > 0
}

// add queues pod as waiting for its claims (waiting true) or as ended
// with claims to unprepare, starting the loop if it is not running. The
// loop sees it at its next round: wake for one now.
func (q *draQueue) add(pod *corev1.Pod, waiting bool) {
	q.mu.Lock()
	if waiting {
		q.waiting[pod.UID] = pod
	} else {
		q.unprepare[pod.UID] = pod
	}
	q.mu.Unlock()
	q.loop.Ensure()
}

// take removes and returns the waiting pod of uid, if any: whoever takes
// it is the only one trying to start it.
func (q *draQueue) take(uid types.UID) (*corev1.Pod, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	pod, ok := q.waiting[uid]
	delete(q.waiting, uid)
	return pod, ok
}

func (q *draQueue) takeAll() (waiting, unprepare []*corev1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for uid, pod := range q.waiting {
		waiting = append(waiting, pod)
		delete(q.waiting, uid)
	}
	for uid, pod := range q.unprepare {
		unprepare = append(unprepare, pod)
		delete(q.unprepare, uid)
	}
	return waiting, unprepare
}

// withClaimStatus returns pod with the claim fields of its status
// (resourceClaimStatuses, extendedResourceClaimStatus) as the API server
// has them: the scheduler and the resource claim controller write them,
// and the pod a backend reports carries the backend's status.
func (p *provider) withClaimStatus(pod *corev1.Pod) *corev1.Pod {
	api := p.podFromAPI(pod.Namespace, pod.Name)
	if api == nil || api.UID != pod.UID {
		return pod
	}
	needClaims := pod.Status.ResourceClaimStatuses == nil && api.Status.ResourceClaimStatuses != nil
	needExtended := pod.Status.ExtendedResourceClaimStatus == nil && api.Status.ExtendedResourceClaimStatus != nil
	if !needClaims && !needExtended {
		return pod // nothing to add: no copy
	}
	out := pod.DeepCopy()
	if out.Status.ResourceClaimStatuses == nil {
		out.Status.ResourceClaimStatuses = api.Status.ResourceClaimStatuses
	}
	if out.Status.ExtendedResourceClaimStatus == nil {
		out.Status.ExtendedResourceClaimStatus = api.Status.ExtendedResourceClaimStatus
	}
	return out
}

// startWithClaims prepares the claims of an admitted pod and hands it to
// the backend. When they cannot be prepared (no such driver on the node,
// the driver failed, the claim is not reserved for the pod yet), the pod
// does not start, as with the kubelet: a Warning event
// FailedPrepareDynamicResources says why, the pod stays Pending with its
// containers waiting (ContainerCreating, the error as their message), and
// the DRA loop tries again when a driver registers and every
// draRetryPeriod. It returns the backend's error.
func (p *provider) startWithClaims(ctx context.Context, pod *corev1.Pod) error {
	for {
		changed := p.host.DRA.PluginsChanged()
		err := p.host.PrepareDynamicResources(ctx, p.withClaimStatus(pod))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !p.current(pod) {
			// Deleted or replaced meanwhile; a failed prepare may have
			// recorded the pod's references.
			p.queueUnprepare(pod)
			return nil
		}
		msg := "Failed to prepare dynamic resources: " + err.Error()
		p.log.Info("Pod waits for its ResourceClaims", "pod", key(pod.Namespace, pod.Name), "err", err)
		if p.recorder != nil {
			p.recorder.Event(pod, corev1.EventTypeWarning, devicehost.FailedPrepareDynamicResources, msg)
		}
		p.publishWaiting(pod, msg)
		p.draq.add(pod, true)
		select {
		case <-changed:
			// A driver came or went while preparing: try again now
			// unless the loop took the pod meanwhile.
			if _, ok := p.draq.take(pod.UID); ok {
				continue
			}
		default:
		}
		return nil
	}
	if !p.current(pod) {
		// Deleted while preparing: the DRA loop unprepares.
		p.queueUnprepare(pod)
		return nil
	}
	if err := p.be.CreatePod(ctx, pod); err != nil {
		p.host.ReleaseDevices(pod.UID)
		return err
	}
	return nil
}

// current reports whether pod is still the node's pod of its name and
// has not ended.
func (p *provider) current(pod *corev1.Pod) bool {
	cur, ok := p.pods.Get(pod.Namespace, pod.Name)
	return ok && cur.UID == pod.UID && !terminal(cur)
}

// publishWaiting stores and publishes pod as waiting for its claims:
// Pending, every container Waiting (ContainerCreating or PodInitializing)
// with msg.
func (p *provider) publishWaiting(pod *corev1.Pod, msg string) {
	w := pod.DeepCopy()
	init, app := podruntime.WaitingStatuses(pod)
	for _, list := range [][]corev1.ContainerStatus{init, app} {
		for i := range list {
			list[i].State.Waiting.Message = msg
		}
	}
	w.Status = corev1.PodStatus{QOSClass: pod.Status.QOSClass, InitContainerStatuses: init, ContainerStatuses: app}
	if prev, ok := p.pods.Get(pod.Namespace, pod.Name); ok && prev.UID == pod.UID {
		// Copies: ComputeStatus edits them, and prev is the store's.
		w.Status.StartTime = prev.Status.StartTime.DeepCopy()
		w.Status.Conditions = slices.Clone(prev.Status.Conditions)
	}
	podruntime.ComputeStatus(pod, &w.Status, p.nodeIP, false)
	updated := false
	p.pods.Update(pod.Namespace, pod.Name, func(cur *corev1.Pod) *corev1.Pod {
		if cur == nil || cur.UID != pod.UID || terminal(cur) {
			return nil
		}
		updated = true
		return w
	})
	if updated {
		p.publish(pod.Namespace, pod.Name)
	}
}

// stopWaiting ends a pod that waits for its claims and is being deleted:
// it never started, so it is Failed at once, as the kubelet makes a
// terminal pod with waiting containers. It reports whether pod waited.
func (p *provider) stopWaiting(pod *corev1.Pod) bool {
	w, ok := p.draq.take(pod.UID)
	if !ok {
		return false
	}
	cur, ok := p.pods.Get(w.Namespace, w.Name)
	if !ok || cur.UID != w.UID {
		return true
	}
	failed := cur.DeepCopy()
	podruntime.ComputeStatus(failed, &failed.Status, p.nodeIP, true)
	failed.Status.Phase = corev1.PodFailed
	p.backendNotify(failed)
	return true
}

// queueUnprepare has the DRA loop unprepare the claims of pod.
func (p *provider) queueUnprepare(pod *corev1.Pod) {
	if !devicehost.HasClaims(pod) && !p.host.DRA.PodMightNeedToUnprepareResources(pod.UID) {
		return
	}
	p.draq.add(pod, false)
	p.draq.wake()
}

// runDRA is the DRA loop: it tries again to start the pods waiting for
// their claims whenever a DRA driver registers or goes, and every
// draRetryPeriod, and unprepares the claims of pods that ended (as the
// kubelet does once a pod's containers stopped); an unprepare that fails
// is tried again every draRetryPeriod (and the DRA manager's reconcile
// loop unprepares the claims of pods no longer active too). It returns
// when ctx ends or it has no pod left to work for (draQueue).
func (p *provider) runDRA(ctx context.Context) {
	t := time.NewTicker(draRetryPeriod)
	defer t.Stop()
	// A driver that registers or goes from here on is a reason to try
	// the waiting pods again.
	changed := p.host.DRA.PluginsChanged()
	for {
		if p.draq.loop.Idle(p.draq.hasWork) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-p.draq.kick:
		case <-t.C:
		}
		changed = p.host.DRA.PluginsChanged()
		waiting, ended := p.draq.takeAll()
		slices.SortFunc(ended, byKey)
		for _, pod := range ended {
			if err := p.host.UnprepareDynamicResources(ctx, p.withClaimStatus(pod)); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Info("Unpreparing the claims of an ended pod failed, will retry", "pod", key(pod.Namespace, pod.Name), "err", err)
				p.draq.add(pod, false) // at the next round, not at once
				continue
			}
			if p.unprepared != nil {
				p.unprepared(pod)
			}
		}
		slices.SortFunc(waiting, byKey)
		for _, pod := range waiting {
			if err := p.startWithClaims(ctx, pod); err != nil && ctx.Err() == nil {
				p.log.Warn("Starting a pod whose claims are prepared", "pod", key(pod.Namespace, pod.Name), "err", err)
			}
		}
	}
}

func byKey(a, b *corev1.Pod) int {
	return strings.Compare(key(a.Namespace, a.Name), key(b.Namespace, b.Name))
}

// cdiEnv returns the CDIDevicesEnv variable of container, nil when it
// uses no claims.
func (p *provider) cdiEnv(pod *corev1.Pod, container string) (*corev1.EnvVar, error) {
	ids, err := p.claimCDIDevices(pod, container)
	if err != nil || len(ids) == 0 {
		return nil, err
	}
	return &corev1.EnvVar{Name: CDIDevicesEnv, Value: strings.Join(ids, ",")}, nil
}

// claimCDIDevices returns the CDI device IDs of container's claims, nil
// when it uses none.
func (p *provider) claimCDIDevices(pod *corev1.Pod, container string) ([]string, error) {
	return p.host.ClaimCDIDevices(p.withClaimStatus(pod), container)
}
