package virtualnode

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/internal/ondemand"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// provider is the virtual-kubelet pod provider: admission through the
// host (devicehost.Host: devices, then claims), then the backend. It keeps
// the last known state of every pod and serves it to the pod controller
// and the PodResources API.
type provider struct {
	log *slog.Logger
	// host admits pods, prepares and unprepares their claims and says
	// what their containers get; draq is the work of the DRA loop
	// (runDRA).
	host *devicehost.Host
	// health runs startHealth's loop while it has notifications.
	health ondemand.Loop
	draq   draQueue
	be     backend.Backend
	// nodeIP is reported in the status of pods waiting for their claims.
	nodeIP string
	// recorder records the kubelet's events; set before pods arrive.
	recorder record.EventRecorder
	// events records the backend's events once recorder exists.
	events eventSink
	// api answers questions about the API server's pods (the pod
	// informer's cache). It is set once the informer exists, which can be
	// after the pods adopted from a previous run report their state, so
	// it is read and written atomically. Nil: see podInAPI, podFromAPI.
	api atomic.Pointer[apiView]
	// unprepared, when set, is called by the DRA loop once the claims of
	// an ended pod are unprepared.
	unprepared func(*corev1.Pod)
	// envs holds the environment virtual-kubelet resolved for each pod
	// (Secrets' values included), in memory only: see podenv.go.
	envs podEnvs

	// pods is the node's pod store (the host's), which the PodResources
	// API serves too: the last known state of every pod, terminated ones
	// included, one per namespace and name.
	pods *podresources.PodStore
	// mu guards notify.
	mu     sync.Mutex
	notify func(*corev1.Pod)
	// node returns the node as the API server has it now (its labels and
	// taints), for the admission predicates; nil until it is known.
	node func() *corev1.Node
	// ownTaints are the taints the node registers with, and hostProcesses
	// says its backend runs containers as host processes: see
	// checkPredicates, checkAppArmor and checkHostProcessSecurity.
	ownTaints     []corev1.Taint
	hostProcesses bool

	// publishing serialises the hand-overs of one pod to the pod
	// controller (striped by key), so that the last one carries the last
	// stored state even when the backend and the health watcher report
	// the same pod at once.
	publishing [32]sync.Mutex
}

// apiView is what the provider asks the API server's pod cache.
type apiView struct {
	// inAPI reports whether the API server still has the pod of that
	// UID.
	inAPI func(namespace, name string, uid types.UID) bool
	// apiPod returns the pod of that name as the API server has it, nil
	// when it has none.
	apiPod func(namespace, name string) *corev1.Pod
}

// podInAPI reports whether the API server still has the pod of that UID;
// true until the pod cache is there.
func (p *provider) podInAPI(namespace, name string, uid types.UID) bool {
	v := p.api.Load()
	return v == nil || v.inAPI == nil || v.inAPI(namespace, name, uid)
}

// podFromAPI returns the pod of that name as the API server has it; nil
// when it has none or the pod cache is not there yet.
func (p *provider) podFromAPI(namespace, name string) *corev1.Pod {
	v := p.api.Load()
	if v == nil || v.apiPod == nil {
		return nil
	}
	return v.apiPod(namespace, name)
}

// newProvider returns a provider admitting through host and keeping its
// pods in host's pod store.
func newProvider(log *slog.Logger, host *devicehost.Host) *provider {
	p := &provider{log: log, host: host, pods: host.Pods}
	p.draq.init()
	return p
}

func key(ns, name string) string { return ns + "/" + name }

func terminal(p *corev1.Pod) bool { return podresources.Terminated(p) }

// backendNotify receives the backend's status changes; they are
// reported with the health of the pod's devices.
func (p *provider) backendNotify(pod *corev1.Pod) {
	stale := false
	p.pods.Update(pod.Namespace, pod.Name, func(cur *corev1.Pod) *corev1.Pod {
		if cur != nil && cur.UID != pod.UID {
			stale = true // a report about a replaced pod
			return nil
		}
		setResourcesStatus(pod, p.resourcesStatus(pod), cur)
		return pod
	})
	if stale {
		return
	}
	if terminal(pod) {
		// The kubelet frees the devices of pods that are no longer
		// active; a terminated pod is not. Its claims are unprepared
		// once its containers stopped.
		p.host.ReleaseDevices(pod.UID)
	}
	p.publish(pod.Namespace, pod.Name)
	if terminal(pod) {
		p.queueUnprepare(pod)
	}
}

// resourcesStatus returns the allocatedResourcesStatus of pod's containers
// by name: the device plugins' devices (the device manager) and the
// devices of their claims (the DRA manager, claim:<name>[/<request>]).
// Nil when the pod holds neither.
func (p *provider) resourcesStatus(pod *corev1.Pod) map[string][]corev1.ResourceStatus {
	byContainer := p.host.Manager.AllocatedResourcesStatus(pod.UID)
	if !p.host.DRA.PodMightNeedToUnprepareResources(pod.UID) {
		return byContainer
	}
	st := corev1.PodStatus{}
	for _, c := range pod.Spec.Containers {
		st.ContainerStatuses = append(st.ContainerStatuses, corev1.ContainerStatus{Name: c.Name, AllocatedResourcesStatus: byContainer[c.Name]})
	}
	p.host.DRA.UpdateAllocatedResourcesStatus(p.withClaimStatus(pod), &st)
	for _, cs := range st.ContainerStatuses {
		if len(cs.AllocatedResourcesStatus) == 0 {
			continue
		}
		if byContainer == nil {
			byContainer = map[string][]corev1.ResourceStatus{}
		}
		byContainer[cs.Name] = cs.AllocatedResourcesStatus
	}
	return byContainer
}

// publish hands the pod stored as namespace/name to the pod controller.
func (p *provider) publish(namespace, name string) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key(namespace, name)))
	l := &p.publishing[h.Sum32()%uint32(len(p.publishing))]
	l.Lock()
	defer l.Unlock()
	p.mu.Lock()
	cb := p.notify
	p.mu.Unlock()
	if pod, ok := p.pods.Get(namespace, name); ok && cb != nil {
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

// startHealth reports again every active pod whose devices' health
// changed, as the kubelet resyncs the pods a device plugin's or a DRA
// driver's health update concerns, until ctx ends or stop is called. The
// device manager's notifications cover health changes, devices no longer
// listed, plugins connecting and going away and resources removed; the
// DRA manager's (Updates) health reports and drivers' health streams
// ending. Every device manager notification also calls devicesChanged,
// when set. It looks once at the start, then on a goroutine that runs
// only while notifications are pending (p.health): an idle node holds
// none for it.
func (p *provider) startHealth(ctx context.Context, devicesChanged func()) (stop func()) {
	var devices, dra atomic.Bool
	// The first look includes devicesChanged: a change between the
	// node's first status and the subscription below is not missed.
	devices.Store(true)
	pending := func() bool { return devices.Load() || dra.Load() }
	p.health.Start(ctx, func(ctx context.Context) {
		for ctx.Err() == nil && !p.health.Idle(pending) {
			if devices.Swap(false) && devicesChanged != nil {
				devicesChanged()
			}
			if dra.Swap(false) {
				select {
				case <-p.host.DRA.Updates(): // the pods are recomputed below
				default:
				}
			}
			for _, pod := range p.refreshHealth() {
				p.publish(pod.Namespace, pod.Name)
			}
		}
	}, pending)
	unsubscribe := p.host.Manager.SubscribeFunc(func() { devices.Store(true); p.health.Ensure() })
	p.host.DRA.OnUpdate(func() { dra.Store(true); p.health.Ensure() })
	return func() {
		unsubscribe()
		p.host.DRA.OnUpdate(nil)
		p.health.Stop()
	}
}

// refreshHealth stores a new state for every active pod whose devices'
// health differs from what its status says, and returns them, sorted by
// namespace and name.
func (p *provider) refreshHealth() []*corev1.Pod {
	var changed []*corev1.Pod
	for _, pod := range p.pods.GetActivePods() {
		updated := false
		p.pods.Update(pod.Namespace, pod.Name, func(cur *corev1.Pod) *corev1.Pod {
			if cur == nil || cur.UID != pod.UID || terminal(cur) {
				return nil // changed since listed
			}
			st := p.resourcesStatus(cur)
			if st == nil || !resourcesStatusDiffers(cur, st) {
				return nil
			}
			upd := cur.DeepCopy()
			setResourcesStatus(upd, st, cur)
			updated = true
			return upd
		})
		if updated {
			changed = append(changed, pod)
		}
	}
	return changed
}

// adopt seeds the store with the backend's pods after a restart.
func (p *provider) adopt(pods []*corev1.Pod) {
	for _, pod := range pods {
		p.pods.Add(pod)
	}
}

// CreatePod admits the pod's device requests (the host's
// AllocateDevices), prepares its ResourceClaims (startWithClaims) and
// hands it to the backend. A pod the device manager rejects is marked
// Failed with the kubelet's reason and message, and a Warning event
// records it, as the kubelet's rejectPod does; so is a pod that fails the
// kubelet's predicates or AppArmor check, or, on a node that runs
// containers as host processes, sets a security field such a node cannot
// apply (checkHostProcessSecurity). A pod whose claims cannot be prepared
// waits, Pending (startWithClaims).
func (p *provider) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	if err := p.dropReplaced(ctx, pod); err != nil {
		return err
	}
	resolved := pod
	pod = p.withoutResolvedEnv(resolved)
	p.envs.put(resolved)
	// The kubelet's predicates come first: a pod refused anyway gets no
	// plugin's Allocate (the kubelet allocates, then checks).
	if node := p.currentNode(); node != nil {
		if f := checkPredicates(pod, node, p.ownTaints, p.hostProcesses); f != nil {
			p.reject(pod, f.predicate, f.message())
			return nil
		}
	}
	if msg := checkAppArmor(pod, p.hostProcesses); msg != "" {
		p.reject(pod, reasonAppArmor, msg)
		return nil
	}
	if p.hostProcesses {
		if _, msg := checkHostProcessSecurity(pod); msg != "" {
			p.reject(pod, reasonSecurityContext, msg)
			return nil
		}
	}
	if err := p.host.AllocateDevices(ctx, p.withClaimStatus(pod)); err != nil {
		var ae *devicehost.AdmissionError
		if !errors.As(err, &ae) {
			return err
		}
		p.reject(pod, ae.Reason, ae.PodMessage())
		return nil
	}
	p.pods.Add(pod)
	if devicehost.HasClaims(pod) {
		return p.startWithClaims(ctx, pod)
	}
	if err := p.be.CreatePod(ctx, pod); err != nil {
		p.host.ReleaseDevices(pod.UID)
		return err
	}
	return nil
}

// currentNode is the node for the admission predicates, nil when unknown.
func (p *provider) currentNode() *corev1.Node {
	if p.node == nil {
		return nil
	}
	return p.node()
}

// reject fails a pod at admission as the kubelet's rejectPod: phase
// Failed, the reason, its message after "Pod was rejected: ", the QoS
// class kept, and a Warning event with the reason and message.
func (p *provider) reject(pod *corev1.Pod, reason, message string) {
	p.log.Info("Pod rejected at admission", "pod", key(pod.Namespace, pod.Name), "reason", reason, "message", message)
	if p.recorder != nil {
		p.recorder.Event(pod, corev1.EventTypeWarning, reason, message)
	}
	failed := pod.DeepCopy()
	failed.Status = corev1.PodStatus{
		Phase:    corev1.PodFailed,
		Reason:   reason,
		Message:  "Pod was rejected: " + message,
		QOSClass: pod.Status.QOSClass,
	}
	p.backendNotify(failed)
}

// UpdatePod accepts the changes the API allows on a running pod (labels,
// annotations, images); none of them affect the backends. A pod that
// replaced one of the same name (deleted and created again before the
// node saw the deletion) is created.
func (p *provider) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	cur, ok := p.pods.Get(pod.Namespace, pod.Name)
	if ok && cur.UID != pod.UID {
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
	return asInAPI(pod, p.podFromAPI(pod.Namespace, pod.Name))
}

// dropReplaced forgets the pod of pod's namespace and name when it has
// another UID: it was deleted from the API server and pod took its name.
func (p *provider) dropReplaced(ctx context.Context, pod *corev1.Pod) error {
	cur, ok := p.pods.Get(pod.Namespace, pod.Name)
	if !ok || cur.UID == pod.UID || !p.pods.Delete(cur.Namespace, cur.Name, cur.UID) {
		return nil
	}
	p.log.Info("Forgetting a pod replaced by one of the same name", "pod", key(pod.Namespace, pod.Name), "uid", cur.UID, "new", pod.UID)
	p.host.ReleaseDevices(cur.UID)
	p.draq.take(cur.UID)
	p.queueUnprepare(cur)
	p.envs.forget(cur.UID)
	return p.be.Forget(ctx, cur)
}

// DeletePod stops a pod that is being deleted (deletionTimestamp set) and
// forgets a pod that is gone from the API server.
func (p *provider) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	cur, ok := p.pods.Get(pod.Namespace, pod.Name)
	if !ok {
		return errdefs.NotFound("pod not found")
	}
	// A pod still in the API server is being deleted: stop it and report
	// its end. One gone from it (or replaced by another of the same name)
	// is forgotten, stopped at once if it still runs.
	gone := !p.podInAPI(cur.Namespace, cur.Name, cur.UID)
	if !gone && pod.DeletionTimestamp != nil && !terminal(cur) {
		if p.stopWaiting(cur) {
			return nil
		}
		return p.be.DeletePod(ctx, pod)
	}
	if !gone && pod.DeletionTimestamp != nil {
		// Already terminal: report it again so the controller finishes
		// the deletion.
		p.backendNotify(cur.DeepCopy())
		return nil
	}
	p.pods.Delete(cur.Namespace, cur.Name, cur.UID)
	p.host.ReleaseDevices(cur.UID)
	p.draq.take(cur.UID)
	p.queueUnprepare(cur)
	p.envs.forget(cur.UID)
	return p.be.Forget(ctx, cur)
}

// GetPod implements node.PodLifecycleHandler.
func (p *provider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	pod, ok := p.pods.Get(namespace, name)
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
	pods := p.pods.List()
	out := make([]*corev1.Pod, len(pods))
	for i, pod := range pods {
		out[i] = pod.DeepCopy()
	}
	return out, nil
}

// NotifyPods implements node.PodNotifier. Pods already known (adopted
// after a restart) are reported at once.
func (p *provider) NotifyPods(_ context.Context, cb func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = cb
	p.mu.Unlock()
	known := p.pods.List()
	go func() {
		for _, pod := range known {
			p.publish(pod.Namespace, pod.Name)
		}
	}()
}

// containerEnv returns a container's resolved environment, waiting for it
// after a restart, then the device plugins' variables, then the CDI
// devices of its claims (CDIDevicesEnv).
func (p *provider) containerEnv(ctx context.Context, pod *corev1.Pod, container string) ([]corev1.EnvVar, error) {
	env, err := p.envs.get(ctx, pod.UID, container)
	if err != nil {
		return nil, err
	}
	o, err := p.host.ContainerResources(p.withClaimStatus(pod), container)
	if err != nil {
		return nil, err
	}
	if o != nil {
		for _, kv := range o.Envs {
			env = append(env, corev1.EnvVar{Name: kv.Name, Value: kv.Value})
		}
	}
	cdi, err := p.cdiEnv(pod, container)
	if err != nil {
		return nil, err
	}
	if cdi != nil {
		env = append(env, *cdi)
	}
	return env, nil
}

// containerDevices returns what the host's ContainerResources gives a
// container, in the kubelet's order (the CDI devices of its claims, then
// the device plugins' device nodes, mounts, annotations and CDI devices),
// as the backend takes it; nil when it has none.
func (p *provider) containerDevices(_ context.Context, pod *corev1.Pod, container string) (*backend.ContainerDevices, error) {
	o, err := p.host.ContainerResources(p.withClaimStatus(pod), container)
	if err != nil || o == nil {
		return nil, err
	}
	cd := &backend.ContainerDevices{CDIDevices: o.CDIDevices}
	for _, d := range o.Devices {
		cd.Devices = append(cd.Devices, backend.DeviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	for _, m := range o.Mounts {
		cd.Mounts = append(cd.Mounts, backend.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, a := range o.Annotations {
		if cd.Annotations == nil {
			cd.Annotations = map[string]string{}
		}
		cd.Annotations[a.Name] = a.Value
	}
	if len(cd.Devices) == 0 && len(cd.Mounts) == 0 && len(cd.Annotations) == 0 && len(cd.CDIDevices) == 0 {
		return nil, nil
	}
	return cd, nil
}

func (p *provider) preStart(ctx context.Context, pod *corev1.Pod, container string) error {
	return p.host.Manager.PreStartContainer(ctx, pod.UID, container)
}
