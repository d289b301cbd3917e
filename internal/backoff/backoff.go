// Package backoff computes exponential retry waits, the same way for every
// retry loop in dpkit: the SDK's registration and listen retries and the
// plugin watcher's registration retries.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential doubles a wait from Initial up to Max.
type Exponential struct {
	Initial, Max time.Duration
}

// Delay returns the wait after the n-th consecutive failure (n >= 1):
// Initial doubled n-1 times, at most Max.
func (e Exponential) Delay(n int) time.Duration {
	d := e.Initial
	for i := 1; i < n; i++ {
		d *= 2
		if d >= e.Max {
			return e.Max
		}
	}
	return min(d, e.Max)
}

// Retry counts consecutive failures and returns the wait before the next
// try: Delay of the count, drawn at random from its upper half when Jitter
// is set, so that many clients retrying at once spread out.
type Retry struct {
	Exponential
	Jitter bool
	n      int
}

// Next counts a failure and returns the wait before the next try.
func (r *Retry) Next() time.Duration {
	r.n++
	d := r.Delay(r.n)
	if !r.Jitter {
		return d
	}
	half := d / 2
	return half + time.Duration(rand.Int64N(int64(d-half)+1))
}

// Reset forgets the failures counted so far.
func (r *Retry) Reset() { r.n = 0 }
