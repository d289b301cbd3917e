package virtualnode

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// TestRunHeartbeatsOnHeartbeatClient runs a node whose heartbeat client is
// not its main client: the Node and its Lease are written through the
// heartbeat client, and no Lease through the main one.
func TestRunHeartbeatsOnHeartbeatClient(t *testing.T) {
	main, hb := fake.NewClientset(), fake.NewClientset()
	w, err := hb.CoordinationV1().Leases(corev1.NamespaceNodeLease).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{
			Name: "vn-hb", Root: testdir.Short(t, "vnp"), Client: main, HeartbeatClient: hb, Port: -1,
			EventRecorder: record.NewFakeRecorder(100),
			NewBackend: func(_, _ string, c backend.Config) (backend.Backend, error) {
				return sim.New(sim.Config{Config: c}), nil
			},
		}, nil)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Added {
			t.Fatalf("first Lease event %s", ev.Type)
		}
	case err := <-done:
		t.Fatalf("Run returned before the Lease was created: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no Lease created through the heartbeat client within 30s")
	}
	if _, err := hb.CoreV1().Nodes().Get(ctx, "vn-hb", metav1.GetOptions{}); err != nil {
		t.Errorf("Node not registered through the heartbeat client: %v", err)
	}
	leases, err := main.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Items) != 0 {
		t.Errorf("Lease written through the main client: %v", leases.Items)
	}
}

// TestNoMetrics: a node keeps the kubelet's metrics (PodResources
// counters among them) unless Config.NoMetrics, when Metrics gathers
// nothing.
func TestNoMetrics(t *testing.T) {
	for _, none := range []bool{false, true} {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		started := make(chan *Node, 1)
		go func() {
			done <- Run(ctx, Config{
				Name: "vn-metrics", Root: testdir.Short(t, "vnp"), Client: fake.NewClientset(), Port: -1, NoMetrics: none,
				EventRecorder: record.NewFakeRecorder(100),
				NewBackend: func(_, _ string, c backend.Config) (backend.Backend, error) {
					return sim.New(sim.Config{Config: c}), nil
				},
			}, func(n *Node) { started <- n })
		}()
		var n *Node
		select {
		case n = <-started:
		case err := <-done:
			t.Fatalf("Run returned before the node started: %v", err)
		}
		mfs, err := n.Metrics().Gather()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, mf := range mfs {
			names = append(names, mf.GetName())
		}
		switch {
		case none && len(names) != 0:
			t.Errorf("NoMetrics: Metrics gathered %v, want nothing", names)
		case !none && !slices.Contains(names, "kubelet_pod_resources_endpoint_requests_total"):
			t.Errorf("Metrics gathered %v, want the PodResources counters among them", names)
		}
	}
}

// TestInformerFactoryStrips: the shared informers hold Nodes and pods
// without managedFields, and Nodes without the status their node last
// applied; the rest stays.
func TestInformerFactoryStrips(t *testing.T) {
	owners := []metav1.ManagedFieldsEntry{{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate}}
	client := fake.NewClientset(
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn", ManagedFields: owners, Labels: map[string]string{"a": "b"},
			Annotations: map[string]string{lastAppliedStatus: `{"capacity":{}}`, "keep": "me"}}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", ManagedFields: owners}},
	)
	f := NewInformerFactory(client)
	nodes, pods := f.Core().V1().Nodes().Lister(), f.Core().V1().Pods().Lister()
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); f.Shutdown() }()
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v not synced", typ)
		}
	}
	n, err := nodes.Get("vn")
	if err != nil {
		t.Fatal(err)
	}
	if n.ManagedFields != nil || n.Annotations[lastAppliedStatus] != "" || n.Annotations["keep"] != "me" || n.Labels["a"] != "b" {
		t.Errorf("cached Node: managedFields %v, annotations %v, labels %v; want no managedFields, only the keep annotation, the labels", n.ManagedFields, n.Annotations, n.Labels)
	}
	p, err := pods.Pods("default").Get("p")
	if err != nil {
		t.Fatal(err)
	}
	if p.ManagedFields != nil {
		t.Errorf("cached pod: managedFields %v, want none", p.ManagedFields)
	}
}
