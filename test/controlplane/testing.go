package controlplane

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// SkipMessage is what tests print when -short skips them.
const SkipMessage = "needs a Kubernetes control plane (kube-apiserver, etcd); skipped under -short. Run without -short after: bash " + BuildScript

// StartForTest starts a control plane for one test and stops it in
// t.Cleanup. Under -short it skips the test; otherwise a control plane that
// cannot start fails the test with the reason and the component's log tail.
func StartForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if testing.Short() {
		t.Skip(SkipMessage)
	}
	cp, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("start control plane: %v", err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

// Shared is one control plane shared by the tests of a package. It starts on
// the first Get, so a package run with -short never starts it, and is
// stopped by Stop, called from TestMain after m.Run:
//
//	var cluster = controlplane.NewShared(controlplane.Options{Scheduler: true})
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		if err := cluster.Stop(); err != nil {
//			fmt.Fprintln(os.Stderr, err)
//		}
//		os.Exit(code)
//	}
//
// Tests sharing it must not depend on each other's objects: use distinct
// namespaces and node names.
type Shared struct {
	opts Options
	once sync.Once
	cp   *ControlPlane
	err  error
}

// NewShared returns a Shared that starts a control plane with opts.
func NewShared(opts Options) *Shared { return &Shared{opts: opts} }

// Get returns the shared control plane, starting it on first use. It skips
// t under -short and fails it when the control plane could not start.
func (s *Shared) Get(t testing.TB) *ControlPlane {
	t.Helper()
	if testing.Short() {
		t.Skip(SkipMessage)
	}
	s.once.Do(func() { s.cp, s.err = Start(context.Background(), s.opts) })
	if s.err != nil {
		t.Fatalf("start shared control plane: %v", s.err)
	}
	return s.cp
}

// Stop stops the control plane if it was started.
func (s *Shared) Stop() error {
	s.once.Do(func() { s.err = fmt.Errorf("controlplane: not started") })
	if s.cp == nil {
		return nil
	}
	return s.cp.Stop()
}

// SharedNode is a control plane with kube-scheduler and
// kube-controller-manager and a real node on it (StartNode), shared by the
// tests of a package like Shared: it starts on the first Get, so -short
// never starts it, and TestMain stops it. Tests sharing it use their own
// namespaces and resource names.
type SharedNode struct {
	cp       *Shared
	nodeOpts NodeOptions
	once     sync.Once
	node     *Node
	err      error
}

// NewSharedNode returns a SharedNode; opts.Scheduler and
// opts.ControllerManager are turned on (a node's DaemonSets need both).
func NewSharedNode(opts Options, nodeOpts NodeOptions) *SharedNode {
	opts.Scheduler, opts.ControllerManager = true, true
	return &SharedNode{cp: NewShared(opts), nodeOpts: nodeOpts}
}

// Get returns the control plane and its node, starting both on first use.
// It skips t under -short and fails it when either could not start.
func (s *SharedNode) Get(t testing.TB) (*ControlPlane, *Node) {
	t.Helper()
	if testing.Short() {
		t.Skip(NodeSkipMessage)
	}
	cp := s.cp.Get(t)
	s.once.Do(func() { s.node, s.err = cp.StartNode(context.Background(), s.nodeOpts) })
	if s.err != nil {
		t.Fatalf("start shared node: %v", s.err)
	}
	return cp, s.node
}

// Stop stops the node and the control plane if they were started.
func (s *SharedNode) Stop() error {
	return s.cp.Stop()
}
