package virtualnode

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	coordv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// LeaseRenewInterval is how often the node renews its Lease: a quarter
// of DefaultLeaseDuration, the kubelet's renewInterval (10 s).
const LeaseRenewInterval = DefaultLeaseDuration * time.Second / 4

// runLease renews the node's Lease in kube-node-lease until ctx ends,
// from when registered closes (the Node is registered), with the
// kubelet's own lease controller (component-helpers' apimachinery/lease,
// as pkg/kubelet runs it): every LeaseRenewInterval, jittered by 4%, for
// DefaultLeaseDuration, held by the node and owned by its Node. A Lease is
// only created with its owner, whose UID comes from the Node as the node
// cache has it (the kubelet reads it from its informer).
//
// Its client creates the Lease before reading it (leaseCreateFirst): a
// node that starts afresh makes one request for its Lease, where the
// kubelet makes two (a GET that finds none, then the POST).
func (n *Node) runLease(ctx context.Context, registered <-chan struct{}) {
	select {
	case <-registered:
	case <-ctx.Done():
		return
	}
	ownedByNode := func(l *coordinationv1.Lease) error {
		if len(l.OwnerReferences) > 0 {
			return nil
		}
		node, err := n.nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return err // not created this time; the next renewal tries again
		}
		l.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: corev1.SchemeGroupVersion.Version,
			Kind:       "Node",
			Name:       node.Name,
			UID:        node.UID,
		}}
		return nil
	}
	// No onRepeatedHeartbeatFailure: the kubelet closes its
	// connections there, against a dead one it would keep; the nodes'
	// HTTP/2 connections close themselves when a ping goes unanswered
	// (sharedConnections' transport, as client-go's).
	c := lease.NewController(clock.RealClock{}, leaseClientset{Interface: n.cfg.HeartbeatClient, leases: newLeaseCreateFirst(n.cfg.HeartbeatClient.CoordinationV1().Leases(corev1.NamespaceNodeLease))},
		n.cfg.Name, DefaultLeaseDuration, nil, LeaseRenewInterval, n.cfg.Name, corev1.NamespaceNodeLease, ownedByNode)
	// The controller logs through klog's context logger: the node's,
	// silent once the node stops (a request it cancelled is no failure).
	c.Run(klog.NewContext(ctx, logr.FromSlogHandler(untilDone{ctx: ctx, Handler: n.log.With("component", "lease").Handler()})))
}

// untilDone is a log handler that drops what is logged once ctx ends.
type untilDone struct {
	ctx context.Context
	slog.Handler
}

func (h untilDone) Enabled(ctx context.Context, l slog.Level) bool {
	return h.ctx.Err() == nil && h.Handler.Enabled(ctx, l)
}

// Handle drops the record once ctx ended: logr hands errors over
// without asking Enabled.
func (h untilDone) Handle(ctx context.Context, r slog.Record) error {
	if h.ctx.Err() != nil {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h untilDone) WithAttrs(attrs []slog.Attr) slog.Handler {
	return untilDone{ctx: h.ctx, Handler: h.Handler.WithAttrs(attrs)}
}

func (h untilDone) WithGroup(name string) slog.Handler {
	return untilDone{ctx: h.ctx, Handler: h.Handler.WithGroup(name)}
}

// leaseClientset is the heartbeat client with the node's Lease client
// (the lease controller takes a whole clientset).
type leaseClientset struct {
	kubernetes.Interface
	leases coordv1client.LeaseInterface
}

func (c leaseClientset) CoordinationV1() coordv1client.CoordinationV1Interface {
	return leaseGroup{CoordinationV1Interface: c.Interface.CoordinationV1(), leases: c.leases}
}

type leaseGroup struct {
	coordv1client.CoordinationV1Interface
	leases coordv1client.LeaseInterface
}

func (g leaseGroup) Leases(namespace string) coordv1client.LeaseInterface {
	if namespace == corev1.NamespaceNodeLease {
		return g.leases
	}
	return g.CoordinationV1Interface.Leases(namespace)
}

// leaseCreateFirst is the node's Lease client, which creates the Lease
// before it reads it, as the kubelet creates its Node before reading it:
// the lease controller's first read (is there a Lease?) is answered
// NotFound without a request, and a Create that finds the Lease there (a
// node that restarts) renews it instead, as the controller renews a Lease
// it found: its duration, renew time and owner set, its holder kept. A
// node that starts afresh thus makes one request for its Lease; one that
// restarts, three (the kubelet's two, and the refused POST).
type leaseCreateFirst struct {
	coordv1client.LeaseInterface
	read atomic.Bool // the first Get was answered
}

func newLeaseCreateFirst(c coordv1client.LeaseInterface) *leaseCreateFirst {
	return &leaseCreateFirst{LeaseInterface: c}
}

func (c *leaseCreateFirst) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if c.read.CompareAndSwap(false, true) {
		return nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), name)
	}
	return c.LeaseInterface.Get(ctx, name, opts)
}

func (c *leaseCreateFirst) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	created, err := c.LeaseInterface.Create(ctx, l, opts)
	if !apierrors.IsAlreadyExists(err) {
		return created, err
	}
	cur, err := c.LeaseInterface.Get(ctx, l.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	cur.Spec.LeaseDurationSeconds, cur.Spec.RenewTime = l.Spec.LeaseDurationSeconds, l.Spec.RenewTime
	if len(cur.OwnerReferences) == 0 {
		cur.OwnerReferences = l.OwnerReferences
	}
	return c.Update(ctx, cur, metav1.UpdateOptions{})
}
