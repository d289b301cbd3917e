package dramanager

import (
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/dramanager/checkpoint"
)

// claimInfo is a claim the node prepares or prepared. prepared and
// unpreparing live in memory only: after a restart a claim from the
// checkpoint is known (its devices are served) but not prepared, so a
// new PrepareResources for it calls the driver again, as the kubelet.
type claimInfo struct {
	checkpoint.ClaimState
	prepared    bool
	unpreparing bool
}

// claimCache holds the claims by namespace/name and is checkpointed to
// Root/dra_manager_state after every change that matters on restart.
type claimCache struct {
	mu     sync.RWMutex
	claims map[string]*claimInfo
	path   string
}

func claimKey(namespace, name string) string { return namespace + "/" + name }

func (c *claimCache) get(namespace, name string) (*claimInfo, bool) {
	ci, ok := c.claims[claimKey(namespace, name)]
	return ci, ok
}

// syncLocked writes the checkpoint; call it with mu held.
func (c *claimCache) syncLocked() error {
	list := make([]checkpoint.ClaimState, 0, len(c.claims))
	for _, ci := range c.claims {
		list = append(list, ci.ClaimState)
	}
	return checkpoint.Write(c.path, list)
}

func (c *claimCache) namesForPod(uid types.UID) []string {
	var out []string
	for _, ci := range c.claims {
		if ci.PodUIDs.Has(string(uid)) {
			out = append(out, ci.ClaimName)
		}
	}
	slices.Sort(out)
	return out
}

// newClaimInfo builds the cache entry of an allocated claim: one driver
// state per driver of its allocation results, devices filled in once the
// driver prepared them.
func newClaimInfo(claim *resourcev1.ResourceClaim) (*claimInfo, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("%w: status.allocation is empty; a scheduler must allocate the claim before the pod runs", ErrNotAllocated)
	}
	drivers := map[string]checkpoint.DriverState{}
	for i, r := range claim.Status.Allocation.Devices.Results {
		if len(r.SkipNodeOperations) > 0 {
			// The alpha DRAOptionalNodeOperations gate is off in the
			// kubelet by default, which then refuses such claims.
			return nil, fmt.Errorf("status.allocation.devices.results[%d].skipNodeOperations: DRAOptionalNodeOperations feature gate is disabled on kubelet", i)
		}
		drivers[r.Driver] = checkpoint.DriverState{}
	}
	return &claimInfo{ClaimState: checkpoint.ClaimState{
		ClaimUID:    string(claim.UID),
		ClaimName:   claim.Name,
		Namespace:   claim.Namespace,
		PodUIDs:     checkpoint.PodSet{},
		DriverState: drivers,
	}}, nil
}

// podClaim is a claim a pod references.
type podClaim struct {
	name string
	// mustCheckOwner is set for claims made from a template, which the
	// pod must own.
	mustCheckOwner bool
}

// podClaims returns the claims of pod: those of spec.resourceClaims
// (by name, or made from a template and named in
// status.resourceClaimStatuses) and the claim the scheduler made for its
// DRA-backed extended resources (status.extendedResourceClaimStatus).
func podClaims(pod *corev1.Pod) ([]podClaim, error) {
	var out []podClaim
	for i := range pod.Spec.ResourceClaims {
		name, owned, err := claimName(pod, &pod.Spec.ResourceClaims[i])
		if err != nil {
			return nil, fmt.Errorf("spec.resourceClaims[%d]: %w", i, err)
		}
		if name != "" {
			out = append(out, podClaim{name: name, mustCheckOwner: owned})
		}
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		out = append(out, podClaim{name: s.ResourceClaimName})
	}
	return out, nil
}

// claimName resolves one entry of spec.resourceClaims. An empty name
// without error means no claim is needed (the template produced none).
func claimName(pod *corev1.Pod, pc *corev1.PodResourceClaim) (string, bool, error) {
	switch {
	case pc.ResourceClaimName != nil:
		return *pc.ResourceClaimName, false, nil
	case pc.ResourceClaimTemplateName != nil:
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == pc.Name {
				if s.ResourceClaimName == nil {
					return "", true, nil
				}
				return *s.ResourceClaimName, true, nil
			}
		}
		return "", false, fmt.Errorf("claim %q comes from template %q but status.resourceClaimStatuses names no ResourceClaim for it yet (the resource claim controller creates it)", pc.Name, *pc.ResourceClaimTemplateName)
	default:
		return "", false, fmt.Errorf("claim %q sets neither resourceClaimName nor resourceClaimTemplateName", pc.Name)
	}
}

// checkClaimForPod checks that pod may use claim: same namespace, owned by
// the pod when made from its template, and reserved for it.
func checkClaimForPod(pod *corev1.Pod, claim *resourcev1.ResourceClaim, mustCheckOwner bool) error {
	if claim.Namespace != pod.Namespace {
		return fmt.Errorf("ResourceClaim %s/%s is not in the same namespace as Pod %s/%s", claim.Namespace, claim.Name, pod.Namespace, pod.Name)
	}
	if mustCheckOwner && !metav1.IsControlledBy(claim, pod) {
		return fmt.Errorf("ResourceClaim %s/%s was not created for Pod %s/%s (Pod is not owner)", claim.Namespace, claim.Name, pod.Namespace, pod.Name)
	}
	for _, r := range claim.Status.ReservedFor {
		if r.UID == pod.UID {
			return nil
		}
	}
	return &reasonError{reason: ErrNotReserved, msg: fmt.Sprintf("pod %s (%s) is not allowed to use ResourceClaim %s (%s): status.reservedFor does not list it", pod.Name, pod.UID, claim.Name, claim.UID)}
}

// containerClaims returns the claim names and requests container uses:
// claim name -> request names ("" for the whole claim).
func containerClaims(pod *corev1.Pod, c *corev1.Container) (map[string][]string, []string, error) {
	uses := map[string][]string{}
	for _, rc := range c.Resources.Claims {
		uses[rc.Name] = append(uses[rc.Name], rc.Request)
	}
	out := map[string][]string{}
	var order []string
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		reqs, ok := uses[pc.Name]
		if !ok {
			continue
		}
		name, _, err := claimName(pod, pc)
		if err != nil {
			return nil, nil, fmt.Errorf("spec.resourceClaims[%d]: %w", i, err)
		}
		if name == "" {
			continue
		}
		if _, seen := out[name]; !seen {
			order = append(order, name)
		}
		out[name] = append(out[name], reqs...)
	}
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil {
		for _, rm := range s.RequestMappings {
			if rm.ContainerName != c.Name {
				continue
			}
			if q, ok := c.Resources.Requests[corev1.ResourceName(rm.ResourceName)]; !ok || q.IsZero() {
				continue
			}
			if _, seen := out[s.ResourceClaimName]; !seen {
				order = append(order, s.ResourceClaimName)
			}
			out[s.ResourceClaimName] = append(out[s.ResourceClaimName], rm.RequestName)
		}
	}
	return out, order, nil
}

// baseRequest strips a subrequest: "req/sub" is "req".
func baseRequest(ref string) string {
	for i := range len(ref) {
		if ref[i] == '/' {
			return ref[:i]
		}
	}
	return ref
}

// cdiDevices returns the CDI device IDs of the devices prepared for
// request ("" for all) in ci, drivers in name order.
func (ci *claimInfo) cdiDevices(request string) []string {
	var out []string
	for _, d := range sortedKeys(ci.DriverState) {
		for _, dev := range ci.DriverState[d].Devices {
			if request == "" || len(dev.RequestNames) == 0 || slices.Contains(dev.RequestNames, request) {
				out = append(out, dev.CDIDeviceIDs...)
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
