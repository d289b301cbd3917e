package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/dpkit/dpkit/pkg/dramanager"
)

// ReasonFailedPrepare is the admin API's reason for a pod whose claims
// could not be prepared, the kubelet's event reason.
const ReasonFailedPrepare = "FailedPrepareDynamicResources"

// ClaimJSONGetter reads one ResourceClaim as an API server serves it
// (cli.DRAReader.ClaimJSON).
type ClaimJSONGetter func(ctx context.Context, namespace, name string) ([]byte, error)

// ClaimsFromJSON is a dramanager.ClaimGetter over get: dpkit kubelet
// --kubeconfig reads claims through dpkit-cluster's API clients, which
// answer in JSON so that the command layer names no API type.
func ClaimsFromJSON(get ClaimJSONGetter) dramanager.ClaimGetter { return jsonClaims(get) }

type jsonClaims ClaimJSONGetter

func (g jsonClaims) GetResourceClaim(ctx context.Context, namespace, name string) (*resourcev1.ResourceClaim, error) {
	data, err := g(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	claim := &resourcev1.ResourceClaim{}
	if err := json.Unmarshal(data, claim); err != nil {
		return nil, fmt.Errorf("decoding ResourceClaim %s/%s: %w", namespace, name, err)
	}
	return claim, nil
}

// ClaimAllocator allocates and reserves a pod's claims, and releases them.
type ClaimAllocator interface {
	// Allocate allocates the pod's claims that are not allocated, for
	// node, and reserves every claim of the pod for it.
	Allocate(ctx context.Context, node string, pod *corev1.Pod) error
	// Release removes the pod's reservations and deallocates claims
	// then reserved for no pod.
	Release(ctx context.Context, pod *corev1.Pod) error
}

// AllocatorFromJSON is a ClaimAllocator over functions that take the pod
// as JSON (cli.DRAReader's Allocate and Release: the command layer names
// no API type).
func AllocatorFromJSON(allocate func(ctx context.Context, node string, pod []byte) error, release func(ctx context.Context, pod []byte) error) ClaimAllocator {
	return jsonAllocator{allocate, release}
}

type jsonAllocator struct {
	allocate func(ctx context.Context, node string, pod []byte) error
	release  func(ctx context.Context, pod []byte) error
}

func (a jsonAllocator) Allocate(ctx context.Context, node string, pod *corev1.Pod) error {
	data, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	return a.allocate(ctx, node, data)
}

func (a jsonAllocator) Release(ctx context.Context, pod *corev1.Pod) error {
	data, err := json.Marshal(pod)
	if err != nil {
		return err
	}
	return a.release(ctx, data)
}

// ClaimAllocation is a claim a container uses, as the node prepared it.
type ClaimAllocation struct {
	// Claim is the ResourceClaim's name (in the pod's namespace).
	Claim string `json:"claim"`
	// Devices are the claim's devices, driver/pool/device.
	Devices []string `json:"devices"`
}

// hasClaims reports whether pod references ResourceClaims.
func hasClaims(pod *corev1.Pod) bool {
	return len(pod.Spec.ResourceClaims) > 0 || pod.Status.ExtendedResourceClaimStatus != nil
}

// prepareClaims allocates pod's claims and reserves them for it, as
// kube-scheduler would have (with an Allocator), then prepares them
// through the DRA drivers, as the kubelet does before a pod's containers
// start.
func (e *Emulator) prepareClaims(ctx context.Context, pod *corev1.Pod) error {
	if !hasClaims(pod) {
		return nil
	}
	if e.opts.Claims == nil {
		return fmt.Errorf("spec.resourceClaims: this emulated kubelet has no API server to read ResourceClaims from; " +
			"start dpkit kubelet (or dpkit up) with --kubeconfig")
	}
	if e.opts.Allocator != nil {
		if err := e.opts.Allocator.Allocate(ctx, e.nodeName, pod); err != nil {
			return fmt.Errorf("allocating the pod's claims for node %s (the scheduler's allocator): %w", e.nodeName, err)
		}
	}
	err := e.dra.PrepareResources(ctx, pod)
	switch {
	case err == nil:
		return nil
	case e.opts.Allocator == nil && (errors.Is(err, dramanager.ErrNotAllocated) || errors.Is(err, dramanager.ErrNotReserved)):
		err = fmt.Errorf("%w\nthis emulated kubelet does not allocate claims: allocate each claim (kube-scheduler does, or any allocator writing status.allocation) "+
			"and reserve it for this pod (status.reservedFor: {resource: pods, name: %s, uid: %s}; set metadata.uid in the manifest) before admitting it",
			err, pod.Name, pod.UID)
	}
	// A driver may have prepared some claims before another failed:
	// release them, the pod is refused.
	e.unprepareAfterFailure(pod)
	return err
}

// unprepareTimeout bounds releasing the claims of a refused pod.
const unprepareTimeout = time.Minute

// unprepareAfterFailure releases what PrepareResources may have prepared
// for pod, which is being refused; what fails is logged and left to the
// DRA manager's reconcile loop.
func (e *Emulator) unprepareAfterFailure(pod *corev1.Pod) {
	if !hasClaims(pod) || e.opts.Claims == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unprepareTimeout)
	defer cancel()
	if err := e.dra.UnprepareResources(ctx, pod); err != nil {
		e.log.Warn("Cannot unprepare the claims of a refused pod", "namespace", pod.Namespace, "name", pod.Name, "err", err)
		return
	}
	if err := e.releaseClaims(ctx, pod); err != nil {
		e.log.Warn("Cannot release the claims of a refused pod", "namespace", pod.Namespace, "name", pod.Name, "err", err)
	}
}

// releaseClaims gives back what the Allocator allocated and reserved for
// pod; without an Allocator there is nothing to give back.
func (e *Emulator) releaseClaims(ctx context.Context, pod *corev1.Pod) error {
	if !hasClaims(pod) || e.opts.Allocator == nil {
		return nil
	}
	if err := e.opts.Allocator.Release(ctx, pod); err != nil {
		return fmt.Errorf("releasing the pod's claims: %w", err)
	}
	return nil
}

// addClaims adds to c the claims container name of pod uses and their
// CDI devices, which the runtime gets before the device plugins' (the
// kubelet's containerManagerImpl.GetResources puts the DRA manager's
// first, then the device manager's).
func (e *Emulator) addClaims(pod *corev1.Pod, name string, c *Container) {
	if !hasClaims(pod) {
		return
	}
	ctr := findContainer(pod, name)
	if ctr == nil {
		return
	}
	for _, dr := range e.dra.GetDynamicResources(pod, ctr) {
		ca := ClaimAllocation{Claim: dr.GetClaimName(), Devices: []string{}}
		for _, r := range dr.GetClaimResources() {
			ca.Devices = append(ca.Devices, r.GetDriverName()+"/"+r.GetPoolName()+"/"+r.GetDeviceName())
		}
		c.Claims = append(c.Claims, ca)
	}
	cdi, err := e.dra.CDIDevices(pod, ctr)
	if err != nil || len(cdi) == 0 {
		return
	}
	if c.Options == nil {
		c.Options = &RuntimeOptions{}
	}
	c.Options.CDIDevices = append(cdi, c.Options.CDIDevices...)
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}
