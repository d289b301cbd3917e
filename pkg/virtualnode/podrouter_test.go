package virtualnode

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// seen records a handler's events as "add <name>", "update <name>",
// "delete <name>".
type seen struct {
	mu     sync.Mutex
	events []string
}

func (s *seen) handler() cache.ResourceEventHandler {
	rec := func(kind string, obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s.mu.Lock()
		s.events = append(s.events, kind+" "+obj.(*corev1.Pod).Name)
		s.mu.Unlock()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { rec("add", obj) },
		UpdateFunc: func(_, obj any) { rec("update", obj) },
		DeleteFunc: func(obj any) { rec("delete", obj) },
	}
}

func (s *seen) waitFor(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		s.mu.Lock()
		got := slices.Clone(s.events)
		s.mu.Unlock()
		ok := true
		for _, w := range want {
			ok = ok && slices.Contains(got, w)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("events %q, want %q among them", got, want)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
}

// TestPodRouter: a node's handlers hear of its own pods only, both nodes
// of a pod that moves, deletions included; a handler added late is told
// of the node's pods first; the listers and the store stay the shared
// informer's.
func TestPodRouter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset()
	factory := informers.NewSharedInformerFactory(client, 0)
	r, err := NewPodRouter(ctx, factory.Core().V1().Pods())
	if err != nil {
		t.Fatal(err)
	}
	var a, b seen
	if _, err := r.For("a").Informer().AddEventHandler(a.handler()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.For("b").Informer().AddEventHandler(b.handler()); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())

	pod := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: node}}
	}
	pods := client.CoreV1().Pods("ns")
	for _, p := range []*corev1.Pod{pod("a1", "a"), pod("b1", "b"), pod("none", ""), pod("mover", "a")} {
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a.waitFor(t, "add a1", "add mover")
	b.waitFor(t, "add b1")
	if _, err := pods.Update(ctx, pod("mover", "b"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "update mover")
	b.waitFor(t, "update mover")
	if err := pods.Delete(ctx, "a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitFor(t, "delete a1")

	// Late: told of b's pods now (b1 and the one that moved there).
	var late seen
	reg, err := r.For("b").Informer().AddEventHandler(late.handler())
	if err != nil {
		t.Fatal(err)
	}
	late.waitFor(t, "add b1", "add mover")
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		t.Fatal("late handler never synced")
	}
	if _, err := pods.Create(ctx, pod("b2", "b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	late.waitFor(t, "add b2")
	b.waitFor(t, "add b2")

	for name, s := range map[string]*seen{"a": &a, "b": &b, "late": &late} {
		s.mu.Lock()
		for _, e := range s.events {
			if e == "add none" || (name == "a" && (e == "add b1" || e == "add b2")) || (name != "a" && e == "add a1") {
				t.Errorf("handler of %s told %q", name, e)
			}
		}
		s.mu.Unlock()
	}
	if p, err := r.For("a").Lister().Pods("ns").Get("b1"); err != nil || p.Spec.NodeName != "b" {
		t.Errorf("the lister is not the shared one: %v %v", p, err)
	}
	if n := len(r.For("a").Informer().GetStore().List()); n != 4 {
		t.Errorf("store has %d pods, want the shared informer's 4", n)
	}
	// Events of many pods arrive in order, per node.
	var order seen
	if _, err := r.For("c").Informer().AddEventHandler(order.handler()); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 50 {
		name := fmt.Sprintf("c%02d", i)
		if _, err := pods.Create(ctx, pod(name, "c"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want = append(want, "add "+name)
	}
	order.waitFor(t, want...)
	order.mu.Lock()
	defer order.mu.Unlock()
	if !slices.Equal(order.events, want) {
		t.Errorf("node c's events %q, want %q in order", order.events, want)
	}
}
