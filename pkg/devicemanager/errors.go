package devicemanager

import (
	"errors"
	"fmt"
)

// Admission failure reasons, as the kubelet sets them in a rejected pod's
// status.reason.
const (
	ReasonUnexpectedAdmissionError = "UnexpectedAdmissionError"
	ReasonTopologyAffinityError    = "TopologyAffinityError"
)

// ErrTopologyAffinity is wrapped by admission errors caused by the topology
// policy; its text is the kubelet's.
var ErrTopologyAffinity = errors.New("Resources cannot be allocated with Topology locality") //nolint:staticcheck // kubelet's text

// ErrNotStarted is returned by calls that need a started manager.
var ErrNotStarted = errors.New("device manager is not running")

// AdmissionError is returned by Admit when a pod cannot get its devices.
// Error returns the kubelet's device manager message (for example
// "requested number of devices unavailable for example.com/dev. Requested:
// 2, Available: 1"); Reason is what the kubelet would put in the pod's
// status.reason.
type AdmissionError struct {
	Reason    string
	Container string
	Err       error
}

func (e *AdmissionError) Error() string { return e.Err.Error() }
func (e *AdmissionError) Unwrap() error { return e.Err }

// PodMessage returns the kubelet's admission message: the message of the
// event it records on the rejected pod; the pod's status.message is
// "Pod was rejected: " followed by it.
func (e *AdmissionError) PodMessage() string {
	if e.Reason == ReasonTopologyAffinityError {
		return e.Err.Error()
	}
	return fmt.Sprintf("Allocate failed due to %v, which is unexpected", e.Err)
}

// IsTopologyAffinityError reports whether err is an admission failure caused
// by the topology policy.
func IsTopologyAffinityError(err error) bool {
	var ae *AdmissionError
	return errors.As(err, &ae) && ae.Reason == ReasonTopologyAffinityError
}

func unexpected(container string, err error) error {
	return &AdmissionError{Reason: ReasonUnexpectedAdmissionError, Container: container, Err: err}
}
