package virtualnode

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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
type nodeCache struct {
	corev1client.NodeInterface
	name string

	mu   sync.Mutex
	last *corev1.Node
	// absent says the last read from the API server found no Node;
	// the next Get answers NotFound without asking again, once.
	absent bool
}

func newNodeCache(nodes corev1client.NodeInterface, name string) *nodeCache {
	return &nodeCache{NodeInterface: nodes, name: name}
}

// read reads the Node from the API server and keeps what it found.
func (c *nodeCache) read(ctx context.Context) (*corev1.Node, error) {
	node, err := c.NodeInterface.Get(ctx, c.name, metav1.GetOptions{})
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil:
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
// returned, or no copy at all when it failed.
func (c *nodeCache) keep(node *corev1.Node, err error) (*corev1.Node, error) {
	if err == nil && node != nil && node.Name != c.name {
		return node, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.absent = false
	c.last = nil
	if err == nil && node != nil {
		c.last = node.DeepCopy()
	}
	return node, err
}

// forget drops the copy: the next Get reads the API server.
func (c *nodeCache) forget() { _, _ = c.keep(nil, nil) }

func (c *nodeCache) Create(ctx context.Context, node *corev1.Node, opts metav1.CreateOptions) (*corev1.Node, error) {
	if node.Name != c.name {
		return c.NodeInterface.Create(ctx, node, opts)
	}
	return c.keep(c.NodeInterface.Create(ctx, node, opts))
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
	return c.keep(c.NodeInterface.Patch(ctx, name, pt, data, opts, subresources...))
}

func (c *nodeCache) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	err := c.NodeInterface.Delete(ctx, name, opts)
	if name == c.name {
		c.forget()
	}
	return err
}
