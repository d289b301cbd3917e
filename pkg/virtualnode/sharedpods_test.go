package virtualnode

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// TestSharedPods runs two nodes on one pod controller: it starts once
// both joined (a node runs, and its plugins may start, before that); each pod runs on, and is reported by, the node it is
// bound to; a pod bound to a node outside the process is left alone;
// a pod deleted from the API server leaves its node; the controller's
// events go to the recorder of the pod's node.
func TestSharedPods(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	client := fake.NewClientset()
	factory := NewInformerFactory(client)
	router, err := NewPodRouter(ctx, factory.Core().V1().Pods())
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"vn-a", "vn-b"}
	shared, err := NewSharedPods(client, factory, names)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, len(names)+1)
	go func() { done <- shared.Run(ctx, 2) }()
	nodes := map[string]chan *Node{}
	recorders := map[string]*record.FakeRecorder{}
	for _, name := range names {
		nodes[name], recorders[name] = make(chan *Node, 1), record.NewFakeRecorder(100)
	}
	start := func(name string) {
		go func() {
			done <- Run(ctx, Config{
				Name: name, Root: testdir.Short(t, "vns"), Client: client, Port: -1,
				Informers: factory, PodRouter: router, SharedPods: shared,
				EventRecorder: recorders[name],
				NewBackend: func(_, _ string, c backend.Config) (backend.Backend, error) {
					return sim.New(sim.Config{Config: c}), nil
				},
			}, func(n *Node) { nodes[name] <- n })
		}()
	}
	defer func() {
		cancel()
		for range len(names) + 1 {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()

	// One node alone: the controller waits for the other.
	start("vn-a")
	pods := client.CoreV1().Pods("ns")
	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
			Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "app"}}},
		}
	}
	for _, p := range []*corev1.Pod{pod("on-a", "vn-a"), pod("on-b", "vn-b"), pod("elsewhere", "vn-x")} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(time.Minute); shared.node("vn-a") == nil; {
		if time.Now().After(deadline) {
			t.Fatal("vn-a did not join in a minute")
		}
		time.Sleep(10 * time.Millisecond) // polling the node's start, with a deadline
	}
	select {
	case <-shared.Ready():
		t.Fatal("the shared pod controller runs with one node of two joined")
	default:
	}
	start("vn-b")
	a, b := <-nodes["vn-a"], <-nodes["vn-b"]

	running := func(name string) *corev1.Pod {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for {
			p, err := pods.Get(ctx, name, metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodRunning {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("pod %s not Running in a minute: %v %v", name, p.Status, err)
			}
			time.Sleep(10 * time.Millisecond) // polling the API server's state, with a deadline
		}
	}
	running("on-a")
	running("on-b")
	if _, ok := a.prov.pods.Get("ns", "on-a"); !ok {
		t.Error("vn-a does not run its pod")
	}
	if _, ok := b.prov.pods.Get("ns", "on-b"); !ok {
		t.Error("vn-b does not run its pod")
	}
	if _, ok := a.prov.pods.Get("ns", "on-b"); ok {
		t.Error("vn-a runs vn-b's pod")
	}
	for _, n := range []*Node{a, b} {
		if _, ok := n.prov.pods.Get("ns", "elsewhere"); ok {
			t.Errorf("%s runs a pod bound to a node outside the process", n.cfg.Name)
		}
	}
	if p, _ := pods.Get(ctx, "elsewhere", metav1.GetOptions{}); p.Status.Phase != "" {
		t.Errorf("a pod bound to a node outside the process got phase %s", p.Status.Phase)
	}

	// Deleted from the API server: forgotten by its node.
	if err := pods.Delete(ctx, "on-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, ok := b.prov.pods.Get("ns", "on-b"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("vn-b still holds its pod a minute after it left the API server")
		}
		time.Sleep(10 * time.Millisecond) // polling the node's state, with a deadline
	}

	// The controller's events: the recorder of the pod's node.
	rec := sharedRecorder{shared}
	rec.Event(pod("on-a", "vn-a"), corev1.EventTypeWarning, "FailedCreate", "on a")
	rec.Eventf(pod("on-b", "vn-b"), corev1.EventTypeWarning, "FailedCreate", "on %s", "b")
	rec.Event(pod("elsewhere", "vn-x"), corev1.EventTypeWarning, "FailedCreate", "nowhere")
	rec.Event(pod("on-a", "vn-a"), corev1.EventTypeNormal, "ProviderCreateSuccess", "success") // withoutVKSuccess
	for name, want := range map[string]string{"vn-a": "on a", "vn-b": "on b"} {
		select {
		case ev := <-recorders[name].Events:
			if !strings.HasSuffix(ev, want) {
				t.Errorf("%s recorded %q, want its own pod's event", name, ev)
			}
		default:
			t.Errorf("%s recorded nothing", name)
		}
		select {
		case ev := <-recorders[name].Events:
			t.Errorf("%s recorded %q too", name, ev)
		default:
		}
	}

	// Nodes outside the process cannot join; a node cannot join twice.
	if _, err := shared.join("vn-x", a.prov, recorders["vn-a"], nil); err == nil {
		t.Error("a node not named joined")
	}
	if _, err := shared.join("vn-a", a.prov, recorders["vn-a"], nil); err == nil {
		t.Error("a node joined twice")
	}
	if err := shared.CreatePod(ctx, pod("late", "vn-x")); !errors.Is(err, ErrNodeNotJoined) {
		t.Errorf("CreatePod on a node not joined: %v, want ErrNodeNotJoined", err)
	}
}

// TestSharedPodsHeld: a deletion is held by the node the pod is bound to
// alone (another node's prepared claims for a pod of the same UID do not
// hold it); a pod the informer's cache lacks is held by whichever node
// holds its UID.
func TestSharedPodsHeld(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	bound := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u"}, Spec: corev1.PodSpec{NodeName: "a"}}
	if err := indexer.Add(bound); err != nil {
		t.Fatal(err)
	}
	holds := func(uids ...types.UID) func(types.UID) bool {
		return func(uid types.UID) bool { return slices.Contains(uids, uid) }
	}
	s := &SharedPods{pods: corev1listers.NewPodLister(indexer), nodes: map[string]*sharedNode{
		"a": {held: holds()},
		"b": {held: holds("u", "gone")},
	}}
	if s.held("ns", "p", "u") {
		t.Error("pod bound to a, which holds nothing: held by b's claims")
	}
	s.nodes["a"].held = holds("u")
	if !s.held("ns", "p", "u") {
		t.Error("pod bound to a, which holds its claims: not held")
	}
	if !s.held("ns", "gone", "gone") {
		t.Error("pod not in the cache, b holds its claims: not held")
	}
	if s.held("ns", "other", "other") {
		t.Error("pod no node holds: held")
	}
}

// TestSharedPodsHolder: a pod bound to a node of the process is that
// node's or none's (a pod of the same name on another node is another
// pod); one gone from the informer's cache is found on whichever node
// has it.
func TestSharedPodsHolder(t *testing.T) {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := indexer.Add(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "new"}, Spec: corev1.PodSpec{NodeName: "a"}}); err != nil {
		t.Fatal(err)
	}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "old"}, Spec: corev1.PodSpec{NodeName: "b"}}
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone", UID: "gone"}, Spec: corev1.PodSpec{NodeName: "b"}}
	a := &sharedNode{prov: &provider{pods: podresources.NewPodStore()}}
	b := &sharedNode{prov: &provider{pods: podresources.NewPodStore(old, gone)}}
	s := &SharedPods{pods: corev1listers.NewPodLister(indexer), names: map[string]bool{"a": true, "b": true}, nodes: map[string]*sharedNode{"a": a, "b": b}}
	if n := s.holder("ns", "p", ""); n != nil {
		t.Error("a pod bound to a, which does not have it yet: held by b's pod of the same name")
	}
	if n := s.holder("ns", "p", "a"); n != nil {
		t.Error("deleting the pod bound to a: b's pod of the same name found")
	}
	if n := s.holder("ns", "p", "b"); n != b {
		t.Error("the old pod, bound to b: not found on b")
	}
	if n := s.holder("ns", "gone", ""); n != b {
		t.Error("a pod gone from the cache: not found on the node that has it")
	}
}
