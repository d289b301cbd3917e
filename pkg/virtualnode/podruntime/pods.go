package podruntime

import (
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Run is what runs one pod in a backend (the kubelet's pod worker).
type Run interface {
	// Pod is the pod as admitted; its name, namespace, UID and creation
	// time never change.
	Pod() *corev1.Pod
	// Snapshot is a copy of the pod with its current status.
	Snapshot() *corev1.Pod
}

// Runs are the pods a backend runs, by UID (the kubelet's pod workers).
// The zero value is empty and ready.
type Runs[R Run] struct {
	mu   sync.Mutex
	runs map[types.UID]R
}

// Add adds the run newRun returns for uid unless uid has one; it returns
// the run of uid and whether it is new.
func (s *Runs[R]) Add(uid types.UID, newRun func() R) (R, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.runs[uid]; ok {
		return r, false
	}
	if s.runs == nil {
		s.runs = map[types.UID]R{}
	}
	r := newRun()
	s.runs[uid] = r
	return r, true
}

// Get returns the run of uid.
func (s *Runs[R]) Get(uid types.UID) (R, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.runs[uid]
	return r, ok
}

// Remove removes the run of uid and returns it.
func (s *Runs[R]) Remove(uid types.UID) (R, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.runs[uid]
	delete(s.runs, uid)
	return r, ok
}

// ByName returns the run of the pod namespace/name; the newest wins when
// a deleted pod of that name is still there.
func (s *Runs[R]) ByName(namespace, name string) (R, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var found R
	var ok bool
	for _, r := range s.runs {
		p := r.Pod()
		if p.Namespace != namespace || p.Name != name {
			continue
		}
		if !ok || p.CreationTimestamp.After(found.Pod().CreationTimestamp.Time) {
			found, ok = r, true
		}
	}
	return found, ok
}

// All returns every run, in no order.
func (s *Runs[R]) All() []R {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]R, 0, len(s.runs))
	for _, r := range s.runs {
		out = append(out, r)
	}
	return out
}

// Pods returns a snapshot of every pod, ordered by "namespace/name" (what
// a backend's Pods returns).
func (s *Runs[R]) Pods() []*corev1.Pod {
	runs := s.All()
	out := make([]*corev1.Pod, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.Snapshot())
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}
