package podresources

import (
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestPodStore(t *testing.T) {
	t.Parallel()
	a := pod("ns2", "a", "u1", nil, "c")
	b := pod("ns1", "b", "u2", nil, "c")
	s := NewPodStore(a, b)

	names := func() []string {
		var out []string
		for _, p := range s.GetActivePods() {
			out = append(out, p.Namespace+"/"+p.Name)
		}
		return out
	}
	if got, want := names(), []string{"ns1/b", "ns2/a"}; !slices.Equal(got, want) {
		t.Errorf("GetActivePods() = %v, want %v", got, want)
	}
	a.Name = "changed"
	if _, ok := s.GetPodByName("ns2", "a"); !ok {
		t.Error("the store shares the caller's pod instead of keeping a copy")
	}
	if _, ok := s.GetPodByName("ns1", "a"); ok {
		t.Error("GetPodByName matched a pod of another namespace")
	}
	if got, want := s.UIDs(), []types.UID{"u1", "u2"}; !slices.Equal(got, want) {
		t.Errorf("UIDs() = %v, want %v", got, want)
	}
	if !s.Remove("u1") || s.Remove("u1") {
		t.Error("Remove should report true once, then false")
	}
	if got, want := names(), []string{"ns1/b"}; !slices.Equal(got, want) {
		t.Errorf("after Remove: %v, want %v", got, want)
	}
	// Replacing by UID.
	s.Add(pod("ns1", "b2", "u2", nil, "c"))
	if got, want := names(), []string{"ns1/b2"}; !slices.Equal(got, want) {
		t.Errorf("after replacing: %v, want %v", got, want)
	}
}

func TestPodStoreConcurrent(t *testing.T) {
	t.Parallel()
	s := NewPodStore()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			uid := types.UID(rune('a' + i))
			for range 100 {
				s.Add(pod("ns", string(uid), string(uid), nil, "c"))
				s.GetActivePods()
				s.GetPodByName("ns", string(uid))
				s.Remove(uid)
			}
		})
	}
	wg.Wait()
	if n := len(s.GetActivePods()); n != 0 {
		t.Errorf("%d pods left, want 0", n)
	}
}

// TestPodStoreByName checks the pod manager's rules the virtual node
// relies on: one pod per namespace and name, a newer pod of a name
// replacing the older, deletes that leave a replacement alone, terminated
// pods kept but not active, and atomic updates.
func TestPodStoreByName(t *testing.T) {
	t.Parallel()
	s := NewPodStore(pod("ns", "web", "old", nil, "c"))
	s.Add(pod("ns", "web", "new", nil, "c"))
	if got, _ := s.Get("ns", "web"); got.UID != "new" {
		t.Fatalf("Get after a pod of the same name was added = %s, want the newer pod", got.UID)
	}
	if got, want := s.UIDs(), []types.UID{"new"}; !slices.Equal(got, want) {
		t.Errorf("UIDs() = %v, want %v: the replaced pod is still indexed", got, want)
	}
	if s.Remove("old") {
		t.Error("Remove of the replaced pod's UID removed something")
	}
	if s.Delete("ns", "web", "old") {
		t.Error("Delete with the replaced pod's UID removed its replacement")
	}
	if _, ok := s.Get("ns", "web"); !ok {
		t.Fatal("the replacement is gone")
	}

	// An update sees the stored pod and stores what it returns, as is.
	done := pod("ns", "web", "new", nil, "c")
	done.Status.Phase = corev1.PodSucceeded
	stored := s.Update("ns", "web", func(cur *corev1.Pod) *corev1.Pod {
		if cur == nil || cur.UID != "new" {
			t.Errorf("Update gave %v, want the stored pod", cur)
		}
		return done
	})
	if stored != done {
		t.Error("Update did not store the pod its function returned")
	}
	if got := s.Update("ns", "web", func(*corev1.Pod) *corev1.Pod { return nil }); got != done {
		t.Error("an Update returning nil changed the store")
	}
	if n := len(s.GetActivePods()); n != 0 {
		t.Errorf("GetActivePods() has %d pods, want none: the only pod has terminated", n)
	}
	if got, ok := s.GetPodByName("ns", "web"); !ok || got != done {
		t.Error("GetPodByName does not find the terminated pod")
	}
	if n := len(s.List()); n != 1 {
		t.Errorf("List() has %d pods, want the terminated one", n)
	}
	if !s.Delete("ns", "web", "new") || len(s.List()) != 0 || len(s.UIDs()) != 0 {
		t.Error("Delete with the stored UID did not remove the pod")
	}
}
