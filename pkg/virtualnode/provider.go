package virtualnode

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sort"
	"sync"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// provider is the virtual-kubelet pod provider: admission through the
// device manager, then the backend. It keeps the last known state of
// every pod and serves it to the pod controller and the PodResources API.
type provider struct {
	log *slog.Logger
	mgr *devicemanager.Manager
	be  backend.Backend
	// recorder records the kubelet's events; set before pods arrive.
	recorder record.EventRecorder
	// inAPI reports whether the API server (the pod informer's cache)
	// still has the pod of that UID; set before pods arrive. Nil means
	// always.
	inAPI func(namespace, name string, uid types.UID) bool
	// apiPod returns the pod of that name as the API server (the pod
	// informer's cache) has it, nil when it has none; set before pods
	// arrive. Nil means never found.
	apiPod func(namespace, name string) *corev1.Pod
	// envs holds the environment virtual-kubelet resolved for each pod
	// (Secrets' values included), in memory only: see podenv.go.
	envs podEnvs

	// mu guards pods and notify. A stored pod is never modified: changes
	// store a new copy, so a stored pointer may be handed out.
	mu     sync.Mutex
	pods   map[string]*corev1.Pod // namespace/name
	notify func(*corev1.Pod)
	// publishing serialises the hand-overs of one pod to the pod
	// controller (striped by key), so that the last one carries the last
	// stored state even when the backend and the health watcher report
	// the same pod at once.
	publishing [32]sync.Mutex
}

func newProvider(log *slog.Logger, mgr *devicemanager.Manager) *provider {
	return &provider{log: log, mgr: mgr, pods: map[string]*corev1.Pod{}}
}

func key(ns, name string) string { return ns + "/" + name }

func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// backendNotify receives the backend's status changes; they are
// reported with the health of the pod's devices.
func (p *provider) backendNotify(pod *corev1.Pod) {
	p.mu.Lock()
	k := key(pod.Namespace, pod.Name)
	cur, ok := p.pods[k]
	if ok && cur.UID != pod.UID {
		p.mu.Unlock()
		return // a stale report about a replaced pod
	}
	setResourcesStatus(pod, p.mgr.AllocatedResourcesStatus(pod.UID), cur)
	p.pods[k] = pod
	p.mu.Unlock()
	if terminal(pod) {
		// The kubelet frees the devices of pods that are no longer
		// active; a terminated pod is not.
		p.mgr.RemovePod(pod.UID)
	}
	p.publish(k)
}

// publish hands the pod stored under k to the pod controller.
func (p *provider) publish(k string) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(k))
	l := &p.publishing[h.Sum32()%uint32(len(p.publishing))]
	l.Lock()
	defer l.Unlock()
	p.mu.Lock()
	pod, cb := p.pods[k], p.notify
	p.mu.Unlock()
	if pod != nil && cb != nil {
		cb(pod)
	}
}

// setResourcesStatus sets the allocatedResourcesStatus of pod's init and
// app container statuses to byContainer, the device manager's
// AllocatedResourcesStatus for the pod, as the kubelet's
// generateAPIPodStatus does (UpdateAllocatedResourcesStatus, KEP-4680).
// Unlike the kubelet (v1.37), which fills only app containers, init and
// restartable init (sidecar) containers holding devices get it too. A pod
// that holds no devices any more (it terminated and freed them) keeps what
// prev, its last stored state, said.
func setResourcesStatus(pod *corev1.Pod, byContainer map[string][]corev1.ResourceStatus, prev *corev1.Pod) {
	if byContainer == nil {
		if prev == nil || prev.UID != pod.UID {
			return
		}
		byContainer = map[string][]corev1.ResourceStatus{}
		for _, list := range [][]corev1.ContainerStatus{prev.Status.InitContainerStatuses, prev.Status.ContainerStatuses} {
			for _, cs := range list {
				if cs.AllocatedResourcesStatus != nil {
					byContainer[cs.Name] = cs.AllocatedResourcesStatus
				}
			}
		}
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for i := range list {
			list[i].AllocatedResourcesStatus = byContainer[list[i].Name]
		}
	}
}

// resourcesStatusDiffers reports whether setResourcesStatus would change
// pod (nil and empty lists are the same).
func resourcesStatusDiffers(pod *corev1.Pod, byContainer map[string][]corev1.ResourceStatus) bool {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, cs := range list {
			if !equality.Semantic.DeepEqual(cs.AllocatedResourcesStatus, byContainer[cs.Name]) {
				return true
			}
		}
	}
	return false
}

// watchHealth reports again every active pod whose devices' health
// changed, as the kubelet resyncs the pods a device plugin's health update
// concerns; it returns when ctx ends. The device manager's notifications
// cover health changes, devices no longer listed, plugins connecting and
// going away and resources removed.
func (p *provider) watchHealth(ctx context.Context) {
	ch, cancel := p.mgr.Subscribe()
	defer cancel()
	for {
		for _, k := range p.refreshHealth() {
			p.publish(k)
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
		}
	}
}

// refreshHealth stores a new state for every active pod whose devices'
// health differs from what its status says, and returns their keys.
func (p *provider) refreshHealth() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var changed []string
	for k, pod := range p.pods {
		if terminal(pod) {
			continue
		}
		st := p.mgr.AllocatedResourcesStatus(pod.UID)
		if st == nil || !resourcesStatusDiffers(pod, st) {
			continue
		}
		upd := pod.DeepCopy()
		setResourcesStatus(upd, st, pod)
		p.pods[k] = upd
		changed = append(changed, k)
	}
	sort.Strings(changed)
	return changed
}

// adopt seeds the store with the backend's pods after a restart.
func (p *provider) adopt(pods []*corev1.Pod) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pod := range pods {
		p.pods[key(pod.Namespace, pod.Name)] = pod
	}
}

// CreatePod admits the pod's device requests and hands it to the backend.
// A pod the device manager rejects is marked Failed with the kubelet's
// reason and message, and a Warning event records it, as the kubelet's
// rejectPod does.
func (p *provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	if err := p.dropReplaced(ctx, pod); err != nil {
		return err
	}
	resolved := pod
	pod = p.withoutResolvedEnv(resolved)
	p.envs.put(resolved)
	if _, err := p.mgr.Admit(ctx, pod); err != nil {
		var ae *devicemanager.AdmissionError
		if !errors.As(err, &ae) {
			return err
		}
		p.log.Info("Pod rejected at admission", "pod", key(pod.Namespace, pod.Name), "reason", ae.Reason, "message", ae.PodMessage())
		if p.recorder != nil {
			p.recorder.Event(pod, corev1.EventTypeWarning, ae.Reason, ae.PodMessage())
		}
		failed := pod.DeepCopy()
		failed.Status = corev1.PodStatus{
			Phase:    corev1.PodFailed,
			Reason:   ae.Reason,
			Message:  "Pod was rejected: " + ae.PodMessage(),
			QOSClass: pod.Status.QOSClass,
		}
		p.backendNotify(failed)
		return nil
	}
	p.mu.Lock()
	p.pods[key(pod.Namespace, pod.Name)] = pod.DeepCopy()
	p.mu.Unlock()
	if err := p.be.CreatePod(ctx, pod); err != nil {
		p.mgr.RemovePod(pod.UID)
		return err
	}
	return nil
}

// UpdatePod accepts the changes the API allows on a running pod (labels,
// annotations, images); none of them affect the backends. A pod that
// replaced one of the same name (deleted and created again before the
// node saw the deletion) is created.
func (p *provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	cur, ok := p.pods[key(pod.Namespace, pod.Name)]
	replaced := ok && cur.UID != pod.UID
	p.mu.Unlock()
	if replaced {
		return p.CreatePod(ctx, pod)
	}
	if ok {
		// Resolved again: after a restart of the node this is the first
		// time, and containers waiting to start get their environment.
		p.envs.put(pod)
	}
	return nil
}

// withoutResolvedEnv returns pod, as virtual-kubelet resolved it, with its
// containers' env and envFrom as the API server has them.
func (p *provider) withoutResolvedEnv(pod *corev1.Pod) *corev1.Pod {
	var api *corev1.Pod
	if p.apiPod != nil {
		api = p.apiPod(pod.Namespace, pod.Name)
	}
	return asInAPI(pod, api)
}

// dropReplaced forgets the pod of pod's namespace and name when it has
// another UID: it was deleted from the API server and pod took its name.
func (p *provider) dropReplaced(ctx context.Context, pod *corev1.Pod) error {
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	cur, ok := p.pods[k]
	if !ok || cur.UID == pod.UID {
		p.mu.Unlock()
		return nil
	}
	delete(p.pods, k)
	p.mu.Unlock()
	p.log.Info("Forgetting a pod replaced by one of the same name", "pod", k, "uid", cur.UID, "new", pod.UID)
	p.mgr.RemovePod(cur.UID)
	p.envs.forget(cur.UID)
	return p.be.Forget(ctx, cur)
}

// DeletePod stops a pod that is being deleted (deletionTimestamp set) and
// forgets a pod that is gone from the API server.
func (p *provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	k := key(pod.Namespace, pod.Name)
	cur, ok := p.pods[k]
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFound("pod not found")
	}
	// A pod still in the API server is being deleted: stop it and report
	// its end. One gone from it (or replaced by another of the same name)
	// is forgotten, stopped at once if it still runs.
	gone := p.inAPI != nil && !p.inAPI(cur.Namespace, cur.Name, cur.UID)
	if !gone && pod.DeletionTimestamp != nil && !terminal(cur) {
		return p.be.DeletePod(ctx, pod)
	}
	if !gone && pod.DeletionTimestamp != nil {
		// Already terminal: report it again so the controller finishes
		// the deletion.
		p.backendNotify(cur.DeepCopy())
		return nil
	}
	p.mu.Lock()
	if c, ok := p.pods[k]; ok && c.UID == cur.UID {
		delete(p.pods, k)
	}
	p.mu.Unlock()
	p.mgr.RemovePod(cur.UID)
	p.envs.forget(cur.UID)
	return p.be.Forget(ctx, cur)
}

// GetPod implements node.PodLifecycleHandler.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, name)
	}
	return pod.DeepCopy(), nil
}

// GetPodStatus implements node.PodLifecycleHandler.
func (p *provider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods implements node.PodLifecycleHandler.
func (p *provider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.DeepCopy())
	}
	sort.Slice(out, func(i, j int) bool {
		return key(out[i].Namespace, out[i].Name) < key(out[j].Namespace, out[j].Name)
	})
	return out, nil
}

// NotifyPods implements node.PodNotifier. Pods already known (adopted
// after a restart) are reported at once.
func (p *provider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = cb
	keys := make([]string, 0, len(p.pods))
	for k := range p.pods {
		keys = append(keys, k)
	}
	p.mu.Unlock()
	go func() {
		for _, k := range keys {
			p.publish(k)
		}
	}()
}

// GetActivePods implements podresources.PodsProvider: admitted pods that
// have not terminated.
func (p *provider) GetActivePods() []*corev1.Pod {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		if !terminal(pod) {
			out = append(out, pod)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return key(out[i].Namespace, out[i].Name) < key(out[j].Namespace, out[j].Name)
	})
	return out
}

// GetPodByName implements podresources.PodsProvider.
func (p *provider) GetPodByName(namespace, name string) (*corev1.Pod, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[key(namespace, name)]
	return pod, ok
}

// containerEnv returns a container's resolved environment, waiting for it
// after a restart, then the device plugins' variables.
func (p *provider) containerEnv(ctx context.Context, pod *corev1.Pod, container string) ([]corev1.EnvVar, error) {
	env, err := p.envs.get(ctx, pod.UID, container)
	if err != nil {
		return nil, err
	}
	if o := p.mgr.ContainerOptions(pod.UID, container); o != nil {
		for _, kv := range o.Envs {
			env = append(env, corev1.EnvVar{Name: kv.Name, Value: kv.Value})
		}
	}
	return env, nil
}

func (p *provider) preStart(ctx context.Context, pod *corev1.Pod, container string) error {
	return p.mgr.PreStartContainer(ctx, pod.UID, container)
}
