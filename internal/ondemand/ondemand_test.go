package ondemand

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// queue is work for a Loop: items added, a run that takes them all.
type queue struct {
	mu    sync.Mutex
	items []int
	done  atomic.Int64 // items taken by the runs
	runs  atomic.Int64 // runs started
	loop  Loop
}

func (q *queue) add(n int) {
	q.mu.Lock()
	q.items = append(q.items, n)
	q.mu.Unlock()
	q.loop.Ensure()
}

func (q *queue) hasWork() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) > 0
}

func (q *queue) run(context.Context) {
	q.runs.Add(1)
	for !q.loop.Idle(q.hasWork) {
		q.mu.Lock()
		n := len(q.items)
		q.items = nil
		q.mu.Unlock()
		q.done.Add(int64(n))
	}
}

// TestLoopRunsOnlyWithWork: nothing runs before Start or without work;
// work added before Start runs at Start; every item added by many
// goroutines at once is taken, by runs that come and go; nothing runs
// after Stop.
func TestLoopRunsOnlyWithWork(t *testing.T) {
	var q queue
	q.add(1) // before Start: waits for it
	if q.runs.Load() != 0 {
		t.Fatal("ran before Start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	q.loop.Start(ctx, q.run, q.hasWork)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for j := range 500 {
				q.add(i*1000 + j)
			}
		})
	}
	wg.Wait()
	// The last add's Ensure either started a run or was seen by the
	// running one: once that run is idle, everything was taken.
	q.loop.Ensure()
	cancel()
	q.loop.Stop()
	if got, want := q.done.Load(), int64(1+16*500); got != want {
		t.Fatalf("%d items taken, want %d", got, want)
	}
	runs := q.runs.Load()
	q.add(7)
	if q.runs.Load() != runs {
		t.Error("ran after Stop")
	}
	t.Logf("%d runs for %d items", runs, 1+16*500)
}

// TestLoopStartWithoutWork: Start with no work (or no hasWork) starts
// nothing, and Idle ends a run when there is none.
func TestLoopStartWithoutWork(t *testing.T) {
	var l Loop
	ran := make(chan struct{}, 2)
	l.Start(context.Background(), func(context.Context) {
		ran <- struct{}{}
		if !l.Idle(func() bool { return false }) {
			t.Error("Idle with no work said to go on")
		}
	}, nil)
	select {
	case <-ran:
		t.Fatal("ran at Start with no work")
	default:
	}
	l.Ensure()
	<-ran
	l.Stop()
}
