//go:build !linux

package controlplane

import (
	"context"
	"fmt"
	"syscall"
)

type nodeImpl struct{}

// StartNode fails: the real node needs Linux.
func (cp *ControlPlane) StartNode(context.Context, NodeOptions) (*Node, error) {
	return nil, fmt.Errorf("controlplane: %w: the kubelet, containerd and runc need Linux", ErrNodeUnsupported)
}

// Stop does nothing: no node runs.
func (n *Node) Stop() error { return nil }

// RestartKubelet fails: no node runs.
func (n *Node) RestartKubelet(context.Context, syscall.Signal) error {
	return fmt.Errorf("controlplane: %w", ErrNodeUnsupported)
}

// Reboot fails: no node runs.
func (n *Node) Reboot(context.Context) error {
	return fmt.Errorf("controlplane: %w", ErrNodeUnsupported)
}

// Binary returns "": no node runs.
func (n *Node) Binary(string) string { return "" }
