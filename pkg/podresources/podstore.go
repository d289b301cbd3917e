package podresources

import (
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodStore is a PodsProvider over an in-memory set of pods, for callers
// that admit pods themselves (an emulated kubelet, tests). It is safe for
// concurrent use. Pods are keyed by UID; GetActivePods returns them sorted
// by namespace and name.
type PodStore struct {
	mu   sync.RWMutex
	pods map[types.UID]*corev1.Pod
}

var _ PodsProvider = (*PodStore)(nil)

// NewPodStore returns a store holding pods.
func NewPodStore(pods ...*corev1.Pod) *PodStore {
	s := &PodStore{pods: make(map[types.UID]*corev1.Pod, len(pods))}
	for _, p := range pods {
		s.Add(p)
	}
	return s
}

// Add stores pod, replacing a pod with the same UID. The store keeps a
// deep copy.
func (s *PodStore) Add(pod *corev1.Pod) {
	c := pod.DeepCopy()
	s.mu.Lock()
	s.pods[c.UID] = c
	s.mu.Unlock()
}

// Remove deletes the pod with uid and reports whether it was there.
func (s *PodStore) Remove(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pods[uid]
	delete(s.pods, uid)
	return ok
}

// UIDs returns the UIDs of the stored pods, sorted.
func (s *PodStore) UIDs() []types.UID {
	s.mu.RLock()
	out := make([]types.UID, 0, len(s.pods))
	for uid := range s.pods {
		out = append(out, uid)
	}
	s.mu.RUnlock()
	slices.Sort(out)
	return out
}

// GetActivePods implements PodsProvider. The pods returned are the
// store's own: callers must not modify them.
func (s *PodStore) GetActivePods() []*corev1.Pod {
	s.mu.RLock()
	out := make([]*corev1.Pod, 0, len(s.pods))
	for _, p := range s.pods {
		out = append(out, p)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(string(a.UID), string(b.UID))
	})
	return out
}

// GetPodByName implements PodsProvider.
func (s *PodStore) GetPodByName(namespace, name string) (*corev1.Pod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, p := range s.pods {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return nil, false
}
