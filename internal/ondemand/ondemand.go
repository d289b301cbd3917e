// Package ondemand runs a loop on a goroutine of its own only while the
// loop has work: none waits idle, which for a thousand simulated nodes in
// one process is a thousand goroutines fewer per loop.
package ondemand

import (
	"context"
	"sync"
)

// Loop runs a function that works until it has nothing left to do. Its
// owner calls Start once, Ensure whenever work comes, and Stop at the
// end; the function calls Idle to learn whether to return. The zero Loop
// is ready to use; a Loop must not be copied after first use.
type Loop struct {
	mu      sync.Mutex
	ctx     context.Context
	run     func(context.Context)
	running bool
	stopped bool
	wg      sync.WaitGroup
}

// Start lets run run on ctx from now on, now if hasWork says there is
// work already (nil: there is none).
func (l *Loop) Start(ctx context.Context, run func(context.Context), hasWork func() bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ctx, l.run = ctx, run
	if hasWork != nil && hasWork() {
		l.startLocked()
	}
}

// Ensure starts run, on a goroutine of its own, unless it runs already,
// Start was not called yet or Stop was. Call it after adding the work,
// where the function's Idle can see it.
func (l *Loop) Ensure() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.startLocked()
}

func (l *Loop) startLocked() {
	if l.running || l.stopped || l.run == nil {
		return
	}
	l.running = true
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.run(l.ctx)
	}()
}

// Idle is for the function: it reports whether hasWork finds no work
// left, in which case the function must return, and the next Ensure
// starts it again. hasWork runs under the Loop's lock, so that work added
// before an Ensure is seen either by it or by the next run.
func (l *Loop) Idle(hasWork func() bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if hasWork() {
		return false
	}
	l.running = false
	return true
}

// Stop keeps run from starting again and waits for it to return: end its
// context first.
func (l *Loop) Stop() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	l.wg.Wait()
}
