// Package broadcast tells any number of waiting goroutines that some state
// changed.
package broadcast

import "sync"

// Change is a "something changed" signal. A waiter takes C before it reads
// the state it watches, so that no change slips in between, and waits for
// C to be closed; whoever changes the state calls Broadcast after. The zero
// Change is ready to use; a Change must not be copied after first use.
type Change struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns a channel closed at the next Broadcast.
func (c *Change) C() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		c.ch = make(chan struct{})
	}
	return c.ch
}

// Broadcast wakes every goroutine waiting on a channel C returned.
func (c *Change) Broadcast() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}
