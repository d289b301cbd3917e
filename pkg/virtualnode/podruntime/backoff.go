package podruntime

import "time"

// The kubelet's restart back-off (pkg/kubelet/kuberuntime: initial 10s,
// at most 5m, forgotten after a run of 10m).
const (
	DefaultBackoffInitial = 10 * time.Second
	DefaultBackoffMax     = 5 * time.Minute
	BackoffResetAfter     = 10 * time.Minute
)

// Backoff is a container's restart back-off, the kubelet's
// CrashLoopBackOff: the delay before the next start is Initial, doubled
// after each restart up to Max. The zero delay is Initial.
type Backoff struct {
	Initial, Max time.Duration
	delay        time.Duration
}

// Delay is how long to wait before the next start.
func (b *Backoff) Delay() time.Duration {
	if b.delay == 0 {
		return b.Initial
	}
	return b.delay
}

// Step doubles the delay, up to Max: a restart happened.
func (b *Backoff) Step() { b.delay = min(2*b.Delay(), b.Max) }

// Ran forgets the back-off when the run that ended lasted longer than
// BackoffResetAfter, as the kubelet does.
func (b *Backoff) Ran(d time.Duration) {
	if d > BackoffResetAfter {
		b.delay = 0
	}
}
