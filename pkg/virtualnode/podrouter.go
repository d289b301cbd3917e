package virtualnode

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	corev1informers "k8s.io/client-go/informers/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// PodRouter shares one pod informer among the nodes of a process (dpkit
// node --count N). Each node's handlers (virtual-kubelet's pod controller
// and the node's own) would otherwise be handlers of the shared informer,
// each told of every pod of the cluster and dropping the others': with a
// thousand nodes, a thousand deliveries per pod event. The router is the
// informer's one handler and hands each event to the node the pod is
// bound to (spec.nodeName; both nodes when it changes), in order, on one
// goroutine per node while the node has events to deliver, so a slow
// handler holds up its own node only, and an idle node has no goroutine.
type PodRouter struct {
	ctx      context.Context
	informer cache.SharedIndexInformer
	lister   corev1listers.PodLister
	reg      cache.ResourceEventHandlerRegistration

	mu    sync.Mutex
	nodes map[string]*routedNode
}

// NewPodRouter makes the router of the shared pod informer pods; it
// delivers nothing once ctx ends. Add it before the informer starts.
func NewPodRouter(ctx context.Context, pods corev1informers.PodInformer) (*PodRouter, error) {
	r := &PodRouter{ctx: ctx, informer: pods.Informer(), lister: pods.Lister(), nodes: map[string]*routedNode{}}
	reg, err := r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if p, ok := obj.(*corev1.Pod); ok {
				r.send(p.Spec.NodeName, func(h cache.ResourceEventHandler) { h.OnAdd(obj, false) })
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Pod)
			n, ok2 := newObj.(*corev1.Pod)
			if !ok1 || !ok2 {
				return
			}
			deliver := func(h cache.ResourceEventHandler) { h.OnUpdate(oldObj, newObj) }
			r.send(n.Spec.NodeName, deliver)
			if o.Spec.NodeName != n.Spec.NodeName {
				r.send(o.Spec.NodeName, deliver)
			}
		},
		DeleteFunc: func(obj any) {
			p, ok := obj.(*corev1.Pod)
			if d, tomb := obj.(cache.DeletedFinalStateUnknown); tomb {
				p, ok = d.Obj.(*corev1.Pod)
			}
			if ok {
				r.send(p.Spec.NodeName, func(h cache.ResourceEventHandler) { h.OnDelete(obj) })
			}
		},
	})
	if err != nil {
		return nil, err
	}
	r.reg = reg
	return r, nil
}

// For returns the pod informer node's handlers and lister use: the shared
// informer, its lister and its store, with the handlers added to it told
// of node's pods only.
func (r *PodRouter) For(node string) corev1informers.PodInformer {
	return routedPodInformer{informer: &routedInformer{SharedIndexInformer: r.informer, r: r, node: node}, lister: r.lister}
}

// send queues deliver for every handler of node, if it has any.
func (r *PodRouter) send(node string, deliver func(cache.ResourceEventHandler)) {
	if node == "" {
		return
	}
	r.mu.Lock()
	rn := r.nodes[node]
	r.mu.Unlock()
	if rn != nil {
		rn.send(deliver)
	}
}

// node returns node's queue.
func (r *PodRouter) node(name string) *routedNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	rn := r.nodes[name]
	if rn == nil {
		rn = &routedNode{ctx: r.ctx}
		r.nodes[name] = rn
	}
	return rn
}

// add registers h for node's pods. Before any event after it, h is told
// of the node's pods in the informer's store as an initial list (what an
// informer does for a handler added late); an event already on its way
// may then repeat one of them, which handlers of an informer must take.
func (r *PodRouter) add(node string, h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	rn := r.node(node)
	reg := &routedRegistration{router: r.reg, replayed: make(chan struct{})}
	rn.mu.Lock()
	rn.handlers = append(rn.handlers, routedHandler{h: h, reg: reg})
	// Queued with the handler added, under the same lock as events are
	// queued: every event after the snapshot is delivered after it.
	rn.pushLocked(func() {
		for _, obj := range r.informer.GetStore().List() {
			if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName == node {
				h.OnAdd(obj, true)
			}
		}
		reg.done.Store(true)
		close(reg.replayed)
	})
	rn.mu.Unlock()
	return reg, nil
}

func (r *PodRouter) remove(node string, reg cache.ResourceEventHandlerRegistration) error {
	rn := r.node(node)
	rn.mu.Lock()
	defer rn.mu.Unlock()
	for i, rh := range rn.handlers {
		if rh.reg == reg {
			rn.handlers = append(rn.handlers[:i:i], rn.handlers[i+1:]...)
			break
		}
	}
	return nil
}

// routedNode is one node's queue of events and its handlers.
type routedNode struct {
	ctx context.Context // the router's

	mu       sync.Mutex
	handlers []routedHandler
	queue    []func()
	// draining says a goroutine delivers the queue (drain).
	draining bool
}

type routedHandler struct {
	h   cache.ResourceEventHandler
	reg *routedRegistration
}

func (rn *routedNode) send(deliver func(cache.ResourceEventHandler)) {
	rn.mu.Lock()
	// The handlers of the moment: one added later learns of this pod
	// from the store.
	hs := rn.handlers
	rn.pushLocked(func() {
		for _, rh := range hs {
			deliver(rh.h)
		}
	})
	rn.mu.Unlock()
}

// pushLocked queues f, starting the goroutine that delivers the queue
// when none runs. rn.mu is held.
func (rn *routedNode) pushLocked(f func()) {
	rn.queue = append(rn.queue, f)
	if rn.draining || rn.ctx.Err() != nil {
		return
	}
	rn.draining = true
	go rn.drain()
}

// drain delivers the queue in order until it is empty or the router's
// context ended.
func (rn *routedNode) drain() {
	for {
		rn.mu.Lock()
		q := rn.queue
		rn.queue = nil
		if len(q) == 0 || rn.ctx.Err() != nil {
			rn.draining = false
			rn.mu.Unlock()
			return
		}
		rn.mu.Unlock()
		for _, f := range q {
			f()
		}
	}
}

// routedRegistration is the registration of a routed handler: synced once
// the router's handler is and the node's pods were replayed to it.
type routedRegistration struct {
	router   cache.ResourceEventHandlerRegistration
	done     atomic.Bool
	replayed chan struct{}
}

func (g *routedRegistration) HasSynced() bool { return g.done.Load() && g.router.HasSynced() }

func (g *routedRegistration) HasSyncedChecker() cache.DoneChecker {
	done := make(chan struct{})
	go func() {
		<-g.replayed
		<-g.router.HasSyncedChecker().Done()
		close(done)
	}()
	return doneChecker{name: "dpkit pod router", done: done}
}

type doneChecker struct {
	name string
	done chan struct{}
}

func (d doneChecker) Name() string          { return d.name }
func (d doneChecker) Done() <-chan struct{} { return d.done }

// routedInformer is the shared pod informer as one node sees it: handlers
// are added to the router for the node; everything else is the shared
// informer's.
type routedInformer struct {
	cache.SharedIndexInformer
	r    *PodRouter
	node string
}

func (i *routedInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return i.r.add(i.node, h)
}

func (i *routedInformer) AddEventHandlerWithResyncPeriod(h cache.ResourceEventHandler, _ time.Duration) (cache.ResourceEventHandlerRegistration, error) {
	return i.r.add(i.node, h)
}

func (i *routedInformer) AddEventHandlerWithOptions(h cache.ResourceEventHandler, _ cache.HandlerOptions) (cache.ResourceEventHandlerRegistration, error) {
	return i.r.add(i.node, h)
}

func (i *routedInformer) RemoveEventHandler(reg cache.ResourceEventHandlerRegistration) error {
	return i.r.remove(i.node, reg)
}

type routedPodInformer struct {
	informer *routedInformer
	lister   corev1listers.PodLister
}

func (p routedPodInformer) Informer() cache.SharedIndexInformer { return p.informer }
func (p routedPodInformer) Lister() corev1listers.PodLister     { return p.lister }
