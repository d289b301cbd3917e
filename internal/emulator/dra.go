package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/dpkit/dpkit/internal/podspec"
	"github.com/dpkit/dpkit/pkg/devicehost"
)

// ClaimJSONGetter reads one ResourceClaim as an API server serves it
// (cli.DRAReader.ClaimJSON).
type ClaimJSONGetter func(ctx context.Context, namespace, name string) ([]byte, error)

// ClaimsFromJSON is a devicehost.ClaimGetter over get: dpkit kubelet
// --kubeconfig reads claims through dpkit-cluster's API clients, which
// answer in JSON so that the command layer names no API type.
func ClaimsFromJSON(get ClaimJSONGetter) devicehost.ClaimGetter { return jsonClaims(get) }

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

// admit admits pod through the host (devicehost.Host.AdmitPod: the device
// manager's allocation, then its claims prepared through the DRA drivers,
// as the kubelet does before a pod's containers start). With an
// Allocator, the pod's claims are first allocated and reserved for it, as
// kube-scheduler would have, and given back when the pod is refused.
// Errors are the host's: *devicehost.AdmissionError,
// *devicehost.PrepareError (its Err saying what this emulated kubelet
// lacks), or another.
func (e *Emulator) admit(ctx context.Context, pod *corev1.Pod) error {
	allocated := false
	if devicehost.HasClaims(pod) && e.opts.Claims != nil && e.opts.Allocator != nil {
		if err := e.opts.Allocator.Allocate(ctx, e.nodeName, pod); err != nil {
			return &devicehost.PrepareError{Err: fmt.Errorf("allocating the pod's claims for node %s (the scheduler's allocator): %w", e.nodeName, err)}
		}
		allocated = true
	}
	err := e.host.AdmitPod(ctx, pod)
	if err == nil {
		return nil
	}
	var pe *devicehost.PrepareError
	if errors.As(err, &pe) {
		pe.Err = e.explainPrepare(pod, pe.Err)
		if allocated {
			e.rollBack(pod, pe.Rollback)
		}
		return pe
	}
	if allocated {
		e.rollBack(pod, nil)
	}
	return err
}

// explainPrepare says what err, the host's refusal to prepare pod's
// claims, asks of this emulated kubelet's user.
func (e *Emulator) explainPrepare(pod *corev1.Pod, err error) error {
	switch {
	case errors.Is(err, devicehost.ErrNoClaimSource):
		return errors.New("spec.resourceClaims: this emulated kubelet has no API server to read ResourceClaims from; " +
			"start dpkit kubelet (or dpkit up) with --kubeconfig")
	case e.opts.Allocator == nil && (errors.Is(err, devicehost.ErrNotAllocated) || errors.Is(err, devicehost.ErrNotReserved)):
		return fmt.Errorf("%w\nthis emulated kubelet does not allocate claims: allocate each claim (kube-scheduler does, or any allocator writing status.allocation) "+
			"and reserve it for this pod (status.reservedFor: {resource: pods, name: %s, uid: %s}; set metadata.uid in the manifest) before admitting it",
			err, pod.Name, pod.UID)
	}
	return err
}

// unprepareTimeout bounds giving back the claims of a refused pod.
const unprepareTimeout = time.Minute

// rollBack gives back what the Allocator allocated for pod, which is being
// refused after the host rolled it back; unprepared is the host's
// RollBackPod error: while a driver may still hold a claim prepared, the
// claim stays allocated (the DRA manager's reconcile loop unprepares it).
func (e *Emulator) rollBack(pod *corev1.Pod, unprepared error) {
	if unprepared != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), unprepareTimeout)
	defer cancel()
	if err := e.releaseClaims(ctx, pod); err != nil {
		e.log.Warn("Cannot release the claims of a refused pod", "namespace", pod.Namespace, "name", pod.Name, "err", err)
	}
}

// releaseClaims gives back what the Allocator allocated and reserved for
// pod; without an Allocator there is nothing to give back.
func (e *Emulator) releaseClaims(ctx context.Context, pod *corev1.Pod) error {
	if !devicehost.HasClaims(pod) || e.opts.Allocator == nil {
		return nil
	}
	if err := e.opts.Allocator.Release(ctx, pod); err != nil {
		return fmt.Errorf("releasing the pod's claims: %w", err)
	}
	return nil
}

// claims returns the claims container name of pod uses, as prepared; their
// CDI devices are in the container's runtime options
// (devicehost.Host.ContainerResources), before the device plugins'.
func (e *Emulator) claims(pod *corev1.Pod, name string) []ClaimAllocation {
	if !devicehost.HasClaims(pod) {
		return nil
	}
	ctr := podspec.Container(pod, name)
	if ctr == nil {
		return nil
	}
	var out []ClaimAllocation
	for _, dr := range e.host.DRA.GetDynamicResources(pod, ctr) {
		ca := ClaimAllocation{Claim: dr.GetClaimName(), Devices: []string{}}
		for _, r := range dr.GetClaimResources() {
			ca.Devices = append(ca.Devices, r.GetDriverName()+"/"+r.GetPoolName()+"/"+r.GetDeviceName())
		}
		out = append(out, ca)
	}
	return out
}
