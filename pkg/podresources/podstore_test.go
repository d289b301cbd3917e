package podresources

import (
	"slices"
	"sync"
	"testing"

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
