package virtualnode

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	vknode "github.com/virtual-kubelet/virtual-kubelet/node"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
)

// SharedPods runs one virtual-kubelet pod controller for all the nodes of
// a process (dpkit node --count N; Config.SharedPods), where each node
// would otherwise run its own: seven goroutines (three queues, their
// workers and the controller) and three queues' worth of memory a node,
// for a node that runs a few pods. The controller's pods are the nodes';
// every call it makes on a pod goes to the node the pod is bound to
// (spec.nodeName), as does every event it records, with that node's
// source. It starts once every node named in NewSharedPods has joined
// (Run), so that a pod left over from before a restart is found on its
// node, as a node's own controller finds it at its start.
//
// A node's pods are synced by the process's workers, not by workers of
// the node's own: --pod-sync-workers counts them.
type SharedPods struct {
	names  map[string]bool
	pods   corev1listers.PodLister
	pc     *vknode.PodController
	joined chan struct{} // closed once every named node joined

	mu     sync.RWMutex
	nodes  map[string]*sharedNode
	notify func(*corev1.Pod) // the controller's, once it asked
	ctx    context.Context   // the controller's, with notify
}

// sharedNode is what the controller reaches of one node.
type sharedNode struct {
	prov     *provider
	recorder record.EventRecorder
	held     func(types.UID) bool
}

// ErrNodeNotJoined is the answer for a pod bound to a node of the process
// that has not joined (or has left) its SharedPods; the controller tries
// the pod again later.
var ErrNodeNotJoined = errors.New("the pod's node is not running in this process")

// NewSharedPods makes the pod controller of the nodes named nodes, over
// the pod, ConfigMap, Secret and Service informers of factory (the nodes'
// Config.Informers), deleting pods through client as each node's own
// controller would. Run it, and give it to each node (Config.SharedPods).
func NewSharedPods(client kubernetes.Interface, factory informers.SharedInformerFactory, nodes []string) (*SharedPods, error) {
	if len(nodes) == 0 {
		return nil, errors.New("shared pods: no node")
	}
	s := &SharedPods{names: make(map[string]bool, len(nodes)), nodes: make(map[string]*sharedNode, len(nodes)), joined: make(chan struct{})}
	for _, n := range nodes {
		s.names[n] = true
	}
	podInformer := factory.Core().V1().Pods()
	s.pods = podInformer.Lister()
	// Each key's retries back off on their own. The controller's default
	// limiter also shares 10 a second, a burst of 100, among every key of
	// a queue: one node's, and a node runs a few pods; the process's
	// thousands of pods would queue behind it.
	limiter := func() workqueue.TypedRateLimiter[any] {
		return workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, 1000*time.Second)
	}
	pc, err := vknode.NewPodController(vknode.PodControllerConfig{
		PodClient:                            holdingPods{PodsGetter: client.CoreV1(), held: s.held},
		PodInformer:                          podInformer,
		EventRecorder:                        sharedRecorder{s},
		Provider:                             s,
		ConfigMapInformer:                    factory.Core().V1().ConfigMaps(),
		SecretInformer:                       factory.Core().V1().Secrets(),
		ServiceInformer:                      factory.Core().V1().Services(),
		SyncPodsFromKubernetesRateLimiter:    limiter(),
		DeletePodsFromKubernetesRateLimiter:  limiter(),
		SyncPodStatusFromProviderRateLimiter: limiter(),
		PodEventFilterFunc: func(_ context.Context, p *corev1.Pod) bool {
			return s.names[p.Spec.NodeName]
		},
	})
	if err != nil {
		return nil, err
	}
	s.pc = pc
	return s, nil
}

// Run runs the controller with workers workers for each of its queues,
// once every node has joined, until ctx ends. A node that fails before it
// joins ends its process, whose ctx this is.
func (s *SharedPods) Run(ctx context.Context, workers int) error {
	select {
	case <-s.joined:
	case <-ctx.Done():
		return nil
	}
	if err := s.pc.Run(ctx, workers); err != nil && ctx.Err() == nil {
		return fmt.Errorf("pod controller: %w", err)
	}
	return nil
}

// Ready is closed once the controller runs, as a node's own controller's
// Ready.
func (s *SharedPods) Ready() <-chan struct{} { return s.pc.Ready() }

// join makes the node name's pods reach prov, its events recorder (as
// virtual-kubelet reports them: withoutVKSuccess) and its deletions wait
// while held reports claims prepared for the pod (holdingPods). leave
// undoes it.
func (s *SharedPods) join(name string, prov *provider, recorder record.EventRecorder, held func(types.UID) bool) (leave func(), err error) {
	if !s.names[name] {
		return nil, fmt.Errorf("node %s is not one of its process's shared pod controller's nodes", name)
	}
	n := &sharedNode{prov: prov, recorder: withoutVKSuccess{recorder}, held: held}
	s.mu.Lock()
	if _, dup := s.nodes[name]; dup {
		s.mu.Unlock()
		return nil, fmt.Errorf("node %s joined its process's shared pod controller twice", name)
	}
	s.nodes[name] = n
	all := len(s.nodes) == len(s.names)
	notify, ctx := s.notify, s.ctx
	s.mu.Unlock()
	if notify != nil {
		prov.NotifyPods(ctx, notify)
	}
	if all {
		select {
		case <-s.joined:
		default:
			close(s.joined)
		}
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.nodes[name] == n {
			delete(s.nodes, name)
		}
	}, nil
}

// node returns the joined node name, or nil.
func (s *SharedPods) node(name string) *sharedNode {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.nodes[name]
}

// podNode returns the joined node of pod, or ErrNodeNotJoined.
func (s *SharedPods) podNode(pod *corev1.Pod) (*sharedNode, error) {
	if n := s.node(pod.Spec.NodeName); n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("pod %s/%s on node %q: %w", pod.Namespace, pod.Name, pod.Spec.NodeName, ErrNodeNotJoined)
}

// holder returns the node that holds the pod namespace/name, or nil. A
// pod bound to a node of the process (nodeName; "": the node it is bound
// to in the informer's cache) is that node's or none's: a pod's node
// never changes, and one of the same name on another node is another pod.
// Only a pod the cache does not have (gone from the API server) is looked
// for on every node: a thousand nodes asked for each new pod were a fifth
// of the process's CPU while pods started.
func (s *SharedPods) holder(namespace, name, nodeName string) *sharedNode {
	if nodeName == "" {
		if p, err := s.pods.Pods(namespace).Get(name); err == nil {
			nodeName = p.Spec.NodeName
		}
	}
	if s.names[nodeName] {
		if n := s.node(nodeName); n != nil {
			if _, ok := n.prov.pods.Get(namespace, name); ok {
				return n
			}
		}
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, n := range s.nodes {
		if _, ok := n.prov.pods.Get(namespace, name); ok {
			return n
		}
	}
	return nil
}

// CreatePod implements node.PodLifecycleHandler on the pod's node.
func (s *SharedPods) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	n, err := s.podNode(pod)
	if err != nil {
		return err
	}
	return n.prov.CreatePod(ctx, pod)
}

// UpdatePod implements node.PodLifecycleHandler on the pod's node.
func (s *SharedPods) UpdatePod(ctx context.Context, pod *corev1.Pod) error {
	n, err := s.podNode(pod)
	if err != nil {
		return err
	}
	return n.prov.UpdatePod(ctx, pod)
}

// DeletePod implements node.PodLifecycleHandler on the node that holds
// the pod.
func (s *SharedPods) DeletePod(ctx context.Context, pod *corev1.Pod) error {
	n := s.holder(pod.Namespace, pod.Name, pod.Spec.NodeName)
	if n == nil {
		return errdefs.NotFoundf("pod %s/%s not found", pod.Namespace, pod.Name)
	}
	return n.prov.DeletePod(ctx, pod)
}

// GetPod implements node.PodLifecycleHandler on the node that holds the
// pod.
func (s *SharedPods) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if n := s.holder(namespace, name, ""); n != nil {
		return n.prov.GetPod(ctx, namespace, name)
	}
	return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, name)
}

// GetPodStatus implements node.PodLifecycleHandler on the node that holds
// the pod.
func (s *SharedPods) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	if n := s.holder(namespace, name, ""); n != nil {
		return n.prov.GetPodStatus(ctx, namespace, name)
	}
	return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, name)
}

// GetPods implements node.PodLifecycleHandler: the pods of every node.
func (s *SharedPods) GetPods(ctx context.Context) ([]*corev1.Pod, error) {
	s.mu.RLock()
	nodes := make([]*sharedNode, 0, len(s.nodes))
	for _, n := range s.nodes {
		nodes = append(nodes, n)
	}
	s.mu.RUnlock()
	var out []*corev1.Pod
	for _, n := range nodes {
		pods, err := n.prov.GetPods(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, pods...)
	}
	return out, nil
}

// NotifyPods implements node.PodNotifier: every node, joined now or
// later, reports its pods' changes to cb.
func (s *SharedPods) NotifyPods(ctx context.Context, cb func(*corev1.Pod)) {
	s.mu.Lock()
	s.notify, s.ctx = cb, ctx
	nodes := make([]*sharedNode, 0, len(s.nodes))
	for _, n := range s.nodes {
		nodes = append(nodes, n)
	}
	s.mu.Unlock()
	for _, n := range nodes {
		n.prov.NotifyPods(ctx, cb)
	}
}

// held reports whether the node of the pod namespace/name of that UID
// still has claims prepared for it (holdingPods). The node the pod is
// bound to is asked; every node of the process only for a pod the
// informer's cache does not have with that UID.
func (s *SharedPods) held(namespace, name string, uid types.UID) bool {
	if p, err := s.pods.Pods(namespace).Get(name); err == nil && p.UID == uid {
		if n := s.node(p.Spec.NodeName); n != nil {
			return n.held(uid)
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, n := range s.nodes {
		if n.held(uid) {
			return true
		}
	}
	return false
}

// sharedRecorder records the controller's events with the recorder of
// the node of the pod they are about.
type sharedRecorder struct{ s *SharedPods }

func (r sharedRecorder) recorder(obj runtime.Object) record.EventRecorder {
	if p, ok := obj.(*corev1.Pod); ok {
		if n := r.s.node(p.Spec.NodeName); n != nil {
			return n.recorder
		}
	}
	return nil
}

func (r sharedRecorder) Event(obj runtime.Object, eventType, reason, message string) {
	if rec := r.recorder(obj); rec != nil {
		rec.Event(obj, eventType, reason, message)
	}
}

func (r sharedRecorder) Eventf(obj runtime.Object, eventType, reason, format string, args ...any) {
	if rec := r.recorder(obj); rec != nil {
		rec.Eventf(obj, eventType, reason, format, args...)
	}
}

func (r sharedRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventType, reason, format string, args ...any) {
	if rec := r.recorder(obj); rec != nil {
		rec.AnnotatedEventf(obj, annotations, eventType, reason, format, args...)
	}
}
