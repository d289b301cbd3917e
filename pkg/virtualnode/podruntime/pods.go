package podruntime

import (
	"context"
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

// WorkerRun is a run whose pod a Worker runs.
type WorkerRun interface {
	Run
	Worker() *Worker
}

// Workers are a backend's pod workers: each pod's run, and the goroutine
// that runs its Worker until the backend closes. The zero value is empty
// and ready.
type Workers[R WorkerRun] struct {
	Runs[R]
	wg sync.WaitGroup
}

// Create adds the run newRun returns for uid unless uid has one; prepare,
// when not nil, readies it (its directory) before its first status is
// published and its worker runs with ctx. It is the backend's CreatePod.
func (s *Workers[R]) Create(ctx context.Context, uid types.UID, newRun func() R, prepare func(R) error) error {
	r, added := s.Add(uid, newRun)
	if !added {
		return nil
	}
	if prepare != nil {
		if err := prepare(r); err != nil {
			return err
		}
	}
	r.Worker().Publish()
	s.Go(ctx, r)
	return nil
}

// Go runs r's worker with ctx (a run added, or one adopted after a
// restart).
func (s *Workers[R]) Go(ctx context.Context, r R) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		r.Worker().Run(ctx)
	}()
}

// Delete asks the worker of pod to stop its containers with the pod's
// grace period. It is the backend's DeletePod.
func (s *Workers[R]) Delete(pod *corev1.Pod) {
	if r, ok := s.Get(pod.UID); ok {
		r.Worker().Stop(GracePeriod(pod))
	}
}

// Forget removes the run of uid and stops what it runs at once, then
// waits for its worker to return: found is false when uid had no run,
// err ctx's error when ctx ended first. It is the start of the backend's
// Forget.
func (s *Workers[R]) Forget(ctx context.Context, uid types.UID) (r R, found bool, err error) {
	r, found = s.Remove(uid)
	if !found {
		return r, false, nil
	}
	r.Worker().Stop(0)
	select {
	case <-r.Worker().Done():
		return r, true, nil
	case <-ctx.Done():
		return r, true, ctx.Err()
	}
}

// Wait waits for every worker to return (the backend's context ended).
func (s *Workers[R]) Wait() { s.wg.Wait() }
