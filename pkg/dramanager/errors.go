package dramanager

import "errors"

// Errors PrepareResources wraps, for callers that explain them (dpkit
// admit says who allocates and reserves claims).
var (
	// ErrNotAllocated: a claim of the pod has no status.allocation.
	ErrNotAllocated = errors.New("not allocated")
	// ErrNotReserved: a claim of the pod does not list the pod in
	// status.reservedFor.
	ErrNotReserved = errors.New("not reserved for the pod")
)

// reasonError is a message that wraps one of the errors above without
// repeating it.
type reasonError struct {
	reason error
	msg    string
}

func (e *reasonError) Error() string { return e.msg }
func (e *reasonError) Unwrap() error { return e.reason }
