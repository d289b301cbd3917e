package cli

import "context"

// DRAReader reads the DRA objects of an API server for dpkit get and the
// emulated kubelet, in plain values (no Kubernetes API type: see Cluster),
// and allocates the claims of the pods dpkit admit admits.
type DRAReader interface {
	// Claims lists the ResourceClaims of namespace (every namespace when
	// empty).
	Claims(ctx context.Context, namespace string) ([]Claim, error)
	// Slices lists the ResourceSlices.
	Slices(ctx context.Context) ([]Slice, error)
	// ClaimJSON reads one ResourceClaim as the API server serves it
	// (JSON), for the DRA manager of dpkit kubelet --kubeconfig, which
	// decodes it (emulator.ClaimsFromJSON).
	ClaimJSON(ctx context.Context, namespace, name string) ([]byte, error)
	// Allocate allocates the claims of pod (JSON) that are not allocated,
	// for node, with the scheduler's allocator, and reserves every claim
	// of the pod for it (emulator.AllocatorFromJSON).
	Allocate(ctx context.Context, node string, pod []byte) error
	// Release removes pod's reservations and deallocates the claims then
	// reserved for no pod.
	Release(ctx context.Context, pod []byte) error
}

// Claim states, from the least to the most advanced.
const (
	// ClaimPending is a claim no allocator has allocated yet.
	ClaimPending = "pending"
	// ClaimAllocated is allocated, and reserved for no pod.
	ClaimAllocated = "allocated"
	// ClaimReserved is allocated and reserved for one or more pods.
	ClaimReserved = "reserved"
	// ClaimPrepared is prepared by the node dpkit get looks at (its
	// PodResources API lists it).
	ClaimPrepared = "prepared"
)

// Claim is a ResourceClaim as dpkit get claims shows it.
type Claim struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// State is ClaimPending, ClaimAllocated, ClaimReserved or
	// ClaimPrepared.
	State string `json:"state"`
	// Node is the node the allocation is for, when its node selector
	// names one node; empty otherwise.
	Node string `json:"node,omitempty"`
	// Devices are the allocated (or prepared) devices.
	Devices []ClaimDevice `json:"devices,omitempty"`
	// ReservedFor lists the pods the claim is reserved for (or prepared
	// for), by name.
	ReservedFor []string `json:"reservedFor,omitempty"`
}

// ClaimDevice is one device of a claim.
type ClaimDevice struct {
	// Request is the claim's request the device serves, when known.
	Request string `json:"request,omitempty"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
	// CDIDeviceIDs are what the driver prepared for the device, when the
	// node's PodResources API says.
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// ShareID is the claim's share of a shared device (its allocation's
	// shareID); empty for a device held whole.
	ShareID string `json:"shareID,omitempty"`
	// Consumed is what the share takes of the device's capacities, as
	// the allocation says (capacity -> quantity).
	Consumed map[string]string `json:"consumed,omitempty"`
}

// Slice is a ResourceSlice as dpkit get slices shows it.
type Slice struct {
	Name string `json:"name"`
	// Node is spec.nodeName; "*" for a slice of every node
	// (spec.allNodes); empty for one with a node selector or for
	// devices that say their own node.
	Node       string   `json:"node,omitempty"`
	Driver     string   `json:"driver"`
	Pool       string   `json:"pool"`
	Generation int64    `json:"generation"`
	Devices    []string `json:"devices"`
}
