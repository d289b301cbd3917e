package broadcast

import (
	"sync"
	"testing"
)

func TestChange(t *testing.T) {
	t.Parallel()
	var c Change
	c.Broadcast() // with no waiter: nothing to wake, no panic
	ch := c.C()
	if ch != c.C() {
		t.Fatal("C changed without a Broadcast")
	}
	select {
	case <-ch:
		t.Fatal("C closed before Broadcast")
	default:
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { <-ch })
	}
	c.Broadcast()
	wg.Wait()
	select {
	case <-c.C():
		t.Fatal("the next C is closed already")
	default:
	}
}
