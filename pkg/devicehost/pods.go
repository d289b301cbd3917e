package devicehost

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/dramanager"
)

// The managers' types a user of the host names: the emulated kubelet and
// the virtual node take them from here and import neither manager.
type (
	// DeviceManager is the device manager (Host.Manager).
	DeviceManager = devicemanager.Manager
	// DRAManager is the DRA manager (Host.DRA).
	DRAManager = dramanager.Manager
	// ClaimGetter reads the ResourceClaims of the pods the host prepares
	// (Config.Claims).
	ClaimGetter = dramanager.ClaimGetter
	// SliceWiper deletes the ResourceSlices of the node's DRA drivers
	// (Config.Slices).
	SliceWiper = dramanager.SliceWiper
	// AdmissionError is a pod the device manager refuses: the kubelet's
	// reason (UnexpectedAdmissionError, TopologyAffinityError) and
	// message (PodMessage).
	AdmissionError = devicemanager.AdmissionError
	// ResourceStatus is one device-plugin resource of the node.
	ResourceStatus = devicemanager.ResourceStatus
	// RunOptions is what the container runtime gets for one container's
	// devices, the device part of the kubelet's RunContainerOptions:
	// environment variables, mounts, device nodes, annotations and
	// fully-qualified CDI device names (Host.ContainerResources).
	RunOptions = devicemanager.ContainerOptions
	// KeyValue is an environment variable or an annotation of RunOptions.
	KeyValue = devicemanager.KeyValue
	// Mount is a bind mount of RunOptions.
	Mount = devicemanager.Mount
	// DeviceSpec is a device node of RunOptions.
	DeviceSpec = devicemanager.DeviceSpec
)

// The DRA manager's errors callers branch on, wrapped by
// PrepareDynamicResources' errors.
var (
	// ErrNotAllocated: a claim of the pod is not allocated.
	ErrNotAllocated = dramanager.ErrNotAllocated
	// ErrNotReserved: a claim of the pod is not reserved for it.
	ErrNotReserved = dramanager.ErrNotReserved
	// ErrNoClaimSource: the pod uses claims and the host has no
	// Config.Claims to read them from.
	ErrNoClaimSource = errors.New("this node has no source of ResourceClaims")
)

// IsExtendedResourceName reports whether name is an extended resource
// name a device plugin may serve.
func IsExtendedResourceName(name string) bool { return devicemanager.IsExtendedResourceName(name) }

// PrepareError is the error of AdmitPod when the pod's claims could not
// be prepared: Err is PrepareDynamicResources' error, Rollback
// RollBackPod's (nil when every claim it may have prepared was
// unprepared).
type PrepareError struct{ Err, Rollback error }

// FailedPrepareDynamicResources is the kubelet's event reason for a pod
// whose claims could not be prepared; the emulator answers with it and the
// virtual node records it.
const FailedPrepareDynamicResources = "FailedPrepareDynamicResources"

func (e *PrepareError) Error() string { return e.Err.Error() }
func (e *PrepareError) Unwrap() error { return e.Err }

// rollbackTimeout bounds unpreparing the claims of a pod being refused.
const rollbackTimeout = time.Minute

// HasClaims reports whether pod uses ResourceClaims: its own
// (spec.resourceClaims) or the one the scheduler made for its DRA-backed
// extended resources (status.extendedResourceClaimStatus).
func HasClaims(pod *corev1.Pod) bool {
	return len(pod.Spec.ResourceClaims) > 0 || pod.Status.ExtendedResourceClaimStatus != nil
}

// AllocateDevices is the kubelet's pod admission for devices: the
// topology manager's admit handler, which has the device manager allocate
// each container's devices (init containers first, a restartable
// sidecar's kept, a non-restartable init container's reused by the
// containers after it) aligned by the topology policy. A refused pod holds
// nothing, and the error is an *AdmissionError. A caller that prepares the
// pod's claims itself (waiting for a driver, as a kubelet's pod worker
// does) calls this, then PrepareDynamicResources; AdmitPod does both.
func (h *Host) AllocateDevices(ctx context.Context, pod *corev1.Pod) error {
	_, err := h.Manager.Admit(ctx, pod)
	return err
}

// PrepareDynamicResources prepares pod's claims through their DRA drivers,
// as the kubelet's container manager does when it syncs a pod, before its
// containers start; a pod without claims needs nothing. It is idempotent.
// The pod must be among Pods' active pods meanwhile, as a kubelet's pod
// manager has it before admitting it: the DRA manager's reconcile loop
// unprepares the claims of pods that are not.
// Errors wrap ErrNoClaimSource, ErrNotAllocated, ErrNotReserved or the
// driver's error.
func (h *Host) PrepareDynamicResources(ctx context.Context, pod *corev1.Pod) error {
	if !HasClaims(pod) {
		return nil
	}
	if h.cfg.Claims == nil {
		return fmt.Errorf("spec.resourceClaims: %w", ErrNoClaimSource)
	}
	return h.DRA.PrepareResources(ctx, pod)
}

// UnprepareDynamicResources unprepares the claims of pod that no other
// pod uses, as the kubelet's container manager does once a pod's
// containers stopped. It is idempotent.
func (h *Host) UnprepareDynamicResources(ctx context.Context, pod *corev1.Pod) error {
	if h.cfg.Claims == nil || !HasClaims(pod) && !h.DRA.PodMightNeedToUnprepareResources(pod.UID) {
		return nil // nothing can have been prepared
	}
	return h.DRA.UnprepareResources(ctx, pod)
}

// AdmitPod admits pod and prepares its claims, what the kubelet does
// before a pod's containers start: AllocateDevices, then
// PrepareDynamicResources (the pod in Pods meanwhile). A pod refused by
// the device manager returns an *AdmissionError; one whose claims cannot
// be prepared a *PrepareError, after RollBackPod: the pod holds neither
// devices nor prepared claims.
//
// The kubelet keeps a pod whose claims failed to prepare, with its
// devices, and tries again at its next sync; AdmitPod refuses it and
// releases its devices at once, for a caller that answers yes or no
// (dpkit kubelet's admin API). A caller that keeps the pod waiting calls
// AllocateDevices and PrepareDynamicResources itself.
func (h *Host) AdmitPod(ctx context.Context, pod *corev1.Pod) error {
	if err := h.AllocateDevices(ctx, pod); err != nil {
		return err
	}
	if err := h.PrepareDynamicResources(ctx, pod); err != nil {
		return &PrepareError{Err: err, Rollback: h.RollBackPod(pod)}
	}
	return nil
}

// RollBackPod releases what AdmitPod gave pod, which is being refused: a
// driver may have prepared some claims before another failed, so its
// claims are unprepared (bounded by a minute), then its devices are
// freed. It returns the unprepare's error, also logged: the claims are
// then left to the DRA manager's reconcile loop, and whoever allocated
// them should not deallocate them while a driver may hold them prepared.
func (h *Host) RollBackPod(pod *corev1.Pod) error {
	ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
	defer cancel()
	err := h.UnprepareDynamicResources(ctx, pod)
	if err != nil {
		h.log.Warn("Cannot unprepare the claims of a refused pod", "namespace", pod.Namespace, "name", pod.Name, "err", err)
	}
	h.ReleaseDevices(pod.UID)
	return err
}

// ReleasePod releases what a pod being removed holds: its claims are
// unprepared, then its devices freed. When unpreparing fails, nothing is
// freed and the error says why: the kubelet keeps a pod until its
// resources are reclaimed, and so should the caller, to try again.
func (h *Host) ReleasePod(ctx context.Context, pod *corev1.Pod) error {
	if err := h.UnprepareDynamicResources(ctx, pod); err != nil {
		return err
	}
	h.ReleaseDevices(pod.UID)
	return nil
}

// ReleaseDevices frees the devices of the pod of that UID, as the kubelet
// frees those of pods that are no longer active (a terminated pod is not);
// its claims are UnprepareDynamicResources' to release.
func (h *Host) ReleaseDevices(uid types.UID) { h.Manager.RemovePod(uid) }

// ClaimCDIDevices returns the CDI device IDs the claims of container give
// it (the DRA manager's part of ContainerResources), in the order of its
// claims; nil when it uses none. A claim not prepared is an error.
func (h *Host) ClaimCDIDevices(pod *corev1.Pod, container string) ([]string, error) {
	if !HasClaims(pod) {
		return nil, nil
	}
	c := podspec.Container(pod, container)
	if c == nil {
		return nil, nil
	}
	ids, err := h.DRA.CDIDevices(pod, c)
	if err != nil {
		return nil, fmt.Errorf("CDI devices of container %s: %w", container, err)
	}
	return ids, nil
}

// ContainerResources returns what the container runtime gets for
// container of pod, merged as the kubelet's container manager merges it
// (GetResources): the CDI devices of the container's claims first, then
// the device plugins' Allocate answers (environment variables, mounts,
// device nodes, annotations and CDI devices, see
// DeviceManager.ContainerOptions for their rules). Nil when the container
// holds no devices and its claims give it no CDI device.
func (h *Host) ContainerResources(pod *corev1.Pod, container string) (*RunOptions, error) {
	cdi, err := h.ClaimCDIDevices(pod, container)
	if err != nil {
		return nil, err
	}
	dev := h.Manager.ContainerOptions(pod.UID, container)
	if dev == nil && len(cdi) == 0 {
		return nil, nil
	}
	opts := &RunOptions{CDIDevices: cdi}
	if dev != nil {
		opts.Envs = dev.Envs
		opts.Mounts = dev.Mounts
		opts.Devices = dev.Devices
		opts.Annotations = dev.Annotations
		opts.CDIDevices = append(opts.CDIDevices, dev.CDIDevices...)
	}
	return opts, nil
}
