package nodeapi

import (
	"context"
	"sync"
)

// flightGroup runs one call per key at a time and gives its result to
// every caller that asked for that key meanwhile, like
// golang.org/x/sync/singleflight as the kubelet's cached token
// authenticator uses it. Unlike singleflight, the call's context is
// cancelled once every caller has gone (its request ended): a review
// nobody waits for any more stops queueing on the review client's rate
// limiter instead of spending it.
type flightGroup[V any] struct {
	mu      sync.Mutex
	flights map[string]*flight[V]
	// joined, when set (by tests), is called each time a caller has
	// joined a call.
	joined func()
}

type flight[V any] struct {
	done    chan struct{}
	v       V
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do returns fn's result for key, calling fn unless a call for key is
// already running. fn's context carries no deadline or values of the
// callers'; it ends when every caller's ctx has ended.
func (g *flightGroup[V]) do(ctx context.Context, key string, fn func(context.Context) (V, error)) (V, error) {
	g.mu.Lock()
	if g.flights == nil {
		g.flights = map[string]*flight[V]{}
	}
	f, ok := g.flights[key]
	if !ok {
		fctx, cancel := context.WithCancel(context.Background())
		f = &flight[V]{done: make(chan struct{}), cancel: cancel}
		g.flights[key] = f
		go func() {
			defer cancel()
			v, err := fn(fctx)
			g.mu.Lock()
			f.v, f.err = v, err
			if g.flights[key] == f {
				delete(g.flights, key)
			}
			g.mu.Unlock()
			close(f.done)
		}()
	}
	f.waiters++
	joined := g.joined
	g.mu.Unlock()
	if joined != nil {
		joined()
	}

	select {
	case <-f.done:
		g.leave(key, f, false)
		return f.v, f.err
	case <-ctx.Done():
		g.leave(key, f, true)
		var zero V
		return zero, ctx.Err()
	}
}

// leave drops one waiter of f; the last one to give up cancels the call
// and lets the next caller of key start a fresh one.
func (g *flightGroup[V]) leave(key string, f *flight[V], gaveUp bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f.waiters--
	if gaveUp && f.waiters == 0 {
		f.cancel()
		if g.flights[key] == f {
			delete(g.flights, key)
		}
	}
}

// len is the number of calls running.
func (g *flightGroup[V]) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.flights)
}
