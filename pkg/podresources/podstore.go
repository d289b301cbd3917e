package podresources

import (
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodStore is the pods a node runs, in memory, as the kubelet's pod
// manager keeps them: one pod per namespace and name, the newest pod of a
// name replacing an older one, terminated pods kept until they are
// removed. It is a PodsProvider and is safe for concurrent use.
//
// A stored pod is never modified: every change stores a new pod, so the
// pods the store hands out may be kept and read without locks, and must
// not be written to.
type PodStore struct {
	mu    sync.RWMutex
	pods  map[string]*corev1.Pod // namespace/name
	byUID map[types.UID]string   // UID -> namespace/name
}

var _ PodsProvider = (*PodStore)(nil)

// NewPodStore returns a store holding pods.
func NewPodStore(pods ...*corev1.Pod) *PodStore {
	s := &PodStore{pods: make(map[string]*corev1.Pod, len(pods)), byUID: make(map[types.UID]string, len(pods))}
	for _, p := range pods {
		s.Add(p)
	}
	return s
}

func podKey(namespace, name string) string { return namespace + "/" + name }

// Add stores a deep copy of pod, replacing the pod of the same namespace
// and name and the pod of the same UID.
func (s *PodStore) Add(pod *corev1.Pod) {
	c := pod.DeepCopy()
	s.mu.Lock()
	s.store(c)
	s.mu.Unlock()
}

// store stores pod as is; s.mu is held.
func (s *PodStore) store(pod *corev1.Pod) {
	k := podKey(pod.Namespace, pod.Name)
	if old, ok := s.byUID[pod.UID]; ok && old != k {
		delete(s.pods, old)
	}
	if old, ok := s.pods[k]; ok && old.UID != pod.UID {
		delete(s.byUID, old.UID)
	}
	s.pods[k] = pod
	s.byUID[pod.UID] = k
}

// Update changes the pod stored as namespace/name atomically: fn gets it
// (nil when there is none) and returns the pod to store in its place, or
// nil to leave the store as it is. The store keeps the pod fn returns,
// not a copy; it must carry namespace and name. Update returns the pod
// stored when it returns.
func (s *PodStore) Update(namespace, name string, fn func(cur *corev1.Pod) *corev1.Pod) *corev1.Pod {
	k := podKey(namespace, name)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur := s.pods[k]
	next := fn(cur)
	if next == nil {
		return cur
	}
	if next.Namespace != namespace || next.Name != name {
		panic("podresources: PodStore.Update stored a pod under another name")
	}
	s.store(next)
	return next
}

// Delete removes the pod stored as namespace/name when its UID is uid (any
// UID when uid is empty), and reports whether it did. A pod that replaced
// the one a caller meant to delete stays.
func (s *PodStore) Delete(namespace, name string, uid types.UID) bool {
	k := podKey(namespace, name)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.pods[k]
	if !ok || (uid != "" && cur.UID != uid) {
		return false
	}
	delete(s.pods, k)
	delete(s.byUID, cur.UID)
	return true
}

// Remove deletes the pod with uid and reports whether it was there.
func (s *PodStore) Remove(uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.byUID[uid]
	if ok {
		delete(s.pods, k)
		delete(s.byUID, uid)
	}
	return ok
}

// UIDs returns the UIDs of the stored pods, sorted.
func (s *PodStore) UIDs() []types.UID {
	s.mu.RLock()
	out := make([]types.UID, 0, len(s.byUID))
	for uid := range s.byUID {
		out = append(out, uid)
	}
	s.mu.RUnlock()
	slices.Sort(out)
	return out
}

// Get returns the pod stored as namespace/name, terminated or not.
func (s *PodStore) Get(namespace, name string) (*corev1.Pod, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	p, ok := s.pods[podKey(namespace, name)]
	return p, ok
}

// List returns every stored pod, terminated ones included, sorted by
// namespace and name.
func (s *PodStore) List() []*corev1.Pod { return s.list(false) }

// GetActivePods implements PodsProvider: the pods that have not
// terminated (phase Succeeded or Failed), as the kubelet's
// GetActivePods, sorted by namespace and name.
func (s *PodStore) GetActivePods() []*corev1.Pod { return s.list(true) }

func (s *PodStore) list(activeOnly bool) []*corev1.Pod {
	s.mu.RLock()
	out := make([]*corev1.Pod, 0, len(s.pods))
	for _, p := range s.pods {
		if !activeOnly || !Terminated(p) {
			out = append(out, p)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// GetPodByName implements PodsProvider; terminated pods are found too, as
// the kubelet's pod manager finds them until they are removed.
func (s *PodStore) GetPodByName(namespace, name string) (*corev1.Pod, bool) {
	return s.Get(namespace, name)
}

// Terminated reports whether pod has reached a terminal phase, Succeeded
// or Failed.
func Terminated(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}
