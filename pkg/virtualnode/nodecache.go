package virtualnode

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// nodeCache is the node's own Node as the node last read or wrote it,
// in front of the Nodes client that virtual-kubelet's node controller
// registers the node and writes its status with.
//
// The controller reads the Node before each status write: a GET for
// every write, three per node while it starts (its registration, the
// devices' registration, their first list), then one for each change.
// Those reads need not reach the API server. The status write is a
// three-way patch: what it removes comes from the last applied status,
// an annotation only this node writes, so the copy this node last wrote
// is an exact base; a copy that misses another writer's later change
// (a label, a taint) only makes the patch set again values it sets
// anyway. So Get answers from the copy. A write that fails forgets it,
// and the next Get reads the API server.
//
// The kubelet reads its Node for each status update too, from the API
// server's watch cache; with 1 000 nodes in one process those reads were
// a third of the requests the nodes made while starting
// (docs/performance.md).
//
// The node creates its Node before it reads it, as the kubelet registers
// (a POST, then a GET only if the Node exists): the controller's first
// read, whether the Node exists, is answered NotFound without a request,
// and a Create that finds the Node there (a node that restarts) takes it
// and hands it to existing, which has its status written over it.
//
// Until the node's Node is first written, its reads and writes are
// retried when they fail for a reason that passes (the request timed out,
// the API server is busy, restarting or unreachable), as the kubelet
// retries its registration until it succeeds: virtual-kubelet's
// controller ends at the first failure of its registration, and with a
// thousand nodes starting in one process, one slow answer would end them
// all. A Create retried after a timeout whose request did create the Node
// finds it there (AlreadyExists) and takes it, as the kubelet takes a
// Node of its name that exists. Once registered, a failed write is the
// controller's to retry at its next update.
type nodeCache struct {
	corev1client.NodeInterface
	name string
	log  *slog.Logger
	// retry is the wait between the registration's attempts.
	retry      wait.Backoff
	registered atomic.Bool

	mu   sync.Mutex
	last *corev1.Node
	// absent says the last read from the API server found no Node, or
	// none was made yet; the next Get answers NotFound without asking,
	// once.
	absent bool
	// existing, when set, is called with the Node that a Create found
	// there and took.
	existing func(*corev1.Node)
}

// registrationRetry is the kubelet's wait between attempts to register:
// 100ms, doubled up to 7s; jittered, so that nodes that failed together
// do not come back together.
var registrationRetry = wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 7 * time.Second}

func newNodeCache(nodes corev1client.NodeInterface, name string) *nodeCache {
	return &nodeCache{NodeInterface: nodes, name: name, log: slog.New(slog.DiscardHandler), retry: registrationRetry, absent: true}
}

// transient reports whether a request that failed with err may succeed if
// made again: it timed out, or the API server was busy, failing or
// unreachable.
func transient(err error) bool {
	switch {
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), apierrors.IsTooManyRequests(err),
		apierrors.IsInternalError(err), apierrors.IsServiceUnavailable(err), apierrors.IsUnexpectedServerError(err):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		return true // the request's own timeout
	case utilnet.IsConnectionReset(err), utilnet.IsConnectionRefused(err), utilnet.IsProbableEOF(err):
		return true
	}
	// Other transport failures (a certificate the node does not trust)
	// do not pass by themselves: they stop the node with their message.
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// untilRegistered calls op until it succeeds, fails for a reason that does
// not pass, or ctx ends, while the node is not registered yet; once it is,
// op is called once.
func untilRegistered[T any](ctx context.Context, c *nodeCache, what string, op func() (T, error)) (T, error) {
	backoff := c.retry
	for {
		v, err := op()
		if err == nil || c.registered.Load() || !transient(err) || ctx.Err() != nil {
			return v, err
		}
		d := backoff.Step()
		c.log.Info("Registering the node: retrying", "request", what, "err", err, "after", d)
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// read reads the Node from the API server and keeps what it found.
func (c *nodeCache) read(ctx context.Context) (*corev1.Node, error) {
	node, err := untilRegistered(ctx, c, "get", func() (*corev1.Node, error) {
		return c.NodeInterface.Get(ctx, c.name, metav1.GetOptions{})
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
		node.ManagedFields = nil
		c.last, c.absent = node, false
	case apierrors.IsNotFound(err):
		c.last, c.absent = nil, true
	default:
		c.last, c.absent = nil, false
	}
	return node, err
}

// Get answers for the node's own Node from the copy when there is one;
// any other name, or no copy, is read from the API server.
func (c *nodeCache) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Node, error) {
	if name != c.name {
		return c.NodeInterface.Get(ctx, name, opts)
	}
	c.mu.Lock()
	last, absent := c.last, c.absent
	c.absent = false
	c.mu.Unlock()
	switch {
	case last != nil:
		return last.DeepCopy(), nil
	case absent:
		return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
	}
	return c.read(ctx)
}

// keep records the outcome of a write of the node's Node: the Node it
// returned, or no copy at all when it failed. The copy is the Node it
// returns: virtual-kubelet's controller keeps that as its view of the
// server and only reads it (it hands out copies), as does this node, so
// one object serves both. It carries no managedFields: nothing reads
// them.
func (c *nodeCache) keep(node *corev1.Node, err error) (*corev1.Node, error) {
	if err == nil && node != nil && node.Name != c.name {
		return node, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.absent = false
	c.last = nil
	if err == nil && node != nil {
		node.ManagedFields = nil
		c.last = node
		c.registered.Store(true)
	}
	return node, err
}

// forget drops the copy: the next Get reads the API server.
func (c *nodeCache) forget() { _, _ = c.keep(nil, nil) }

func (c *nodeCache) Create(ctx context.Context, node *corev1.Node, opts metav1.CreateOptions) (*corev1.Node, error) {
	if node.Name != c.name {
		return c.NodeInterface.Create(ctx, node, opts)
	}
	found := false
	created, err := c.keep(untilRegistered(ctx, c, "create", func() (*corev1.Node, error) {
		created, err := c.NodeInterface.Create(ctx, node, opts)
		if found = apierrors.IsAlreadyExists(err); found {
			// An earlier run's, or an attempt of this one that timed
			// out after it created the Node: the kubelet takes a
			// Node of its name that exists.
			return c.NodeInterface.Get(ctx, c.name, metav1.GetOptions{})
		}
		return created, err
	}))
	if err == nil && found && c.existing != nil {
		c.existing(created)
	}
	return created, err
}

func (c *nodeCache) Update(ctx context.Context, node *corev1.Node, opts metav1.UpdateOptions) (*corev1.Node, error) {
	if node.Name != c.name {
		return c.NodeInterface.Update(ctx, node, opts)
	}
	return c.keep(c.NodeInterface.Update(ctx, node, opts))
}

func (c *nodeCache) UpdateStatus(ctx context.Context, node *corev1.Node, opts metav1.UpdateOptions) (*corev1.Node, error) {
	if node.Name != c.name {
		return c.NodeInterface.UpdateStatus(ctx, node, opts)
	}
	return c.keep(c.NodeInterface.UpdateStatus(ctx, node, opts))
}

func (c *nodeCache) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*corev1.Node, error) {
	if name != c.name {
		return c.NodeInterface.Patch(ctx, name, pt, data, opts, subresources...)
	}
	return c.keep(untilRegistered(ctx, c, "patch", func() (*corev1.Node, error) {
		return c.NodeInterface.Patch(ctx, name, pt, data, opts, subresources...)
	}))
}

func (c *nodeCache) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	err := c.NodeInterface.Delete(ctx, name, opts)
	if name == c.name {
		c.forget()
	}
	return err
}
