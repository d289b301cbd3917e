package backoff

import (
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	e := Exponential{Initial: 500 * time.Millisecond, Max: 2*time.Minute + 2*time.Second}
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{1, 500 * time.Millisecond}, {2, time.Second}, {3, 2 * time.Second}, {8, 64 * time.Second}, {9, e.Max}, {1000, e.Max}} {
		if got := e.Delay(tc.n); got != tc.want {
			t.Errorf("Delay(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	r := Retry{Exponential: Exponential{Initial: 100 * time.Millisecond, Max: time.Second}, Jitter: true}
	for i := range 20 {
		full := r.Delay(i + 1)
		if got := r.Next(); got < full/2 || got > full {
			t.Fatalf("try %d: Next() = %v, want within [%v, %v]", i+1, got, full/2, full)
		}
	}
	r.Reset()
	if got := r.Next(); got > 100*time.Millisecond {
		t.Errorf("Next() after Reset = %v, want at most the initial wait", got)
	}
	plain := Retry{Exponential: Exponential{Initial: time.Second, Max: 4 * time.Second}}
	for _, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		if got := plain.Next(); got != want {
			t.Errorf("Next() without jitter = %v, want %v", got, want)
		}
	}
}
