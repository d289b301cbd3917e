// Package claimalloc allocates a pod's ResourceClaims as kube-scheduler
// does, for an emulated kubelet that runs without a scheduler (dpkit up
// --kubeconfig, then dpkit admit): the allocator is the scheduler's own
// (k8s.io/dynamic-resource-allocation/structured) with the feature gates
// of v1.37, fed with the API server's ResourceSlices, DeviceClasses and
// the devices every other claim holds. Release undoes it when the pod is
// deleted, as the resourceclaim controller does: the pod's reservation is
// removed, and a claim reserved for no pod is deallocated.
//
// It links client-go and the allocator, so only dpkit-cluster has it.
package claimalloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
)

// Finalizer is the finalizer kube-scheduler puts on a claim it allocates
// (and the resourceclaim controller removes once it is deallocated), so
// that an allocated claim is not deleted while a pod may use it.
const Finalizer = "resource.kubernetes.io/delete-protection"

// Features are the allocator features of a v1.37 control plane with its
// default feature gates: GA admin access, prioritized lists and device
// taints; beta (on) partitionable devices, consumable capacity with
// fractional ranges and binding conditions.
var Features = structured.Features{
	AdminAccess:             true,
	ConsumableCapacity:      true,
	DeviceBindingAndStatus:  true,
	DeviceTaints:            true,
	FractionalCapacityRange: true,
	PartitionableDevices:    true,
	PrioritizedList:         true,
}

// ErrUnsatisfiable is wrapped by the error of an allocation no device set
// satisfies.
var ErrUnsatisfiable = errors.New("cannot allocate all claims")

// Allocate allocates the pod's claims that are not allocated, for node,
// and reserves every claim of the pod for it (status.reservedFor), as
// kube-scheduler's DRA plugin does in Reserve and PreBind. A claim of
// another node's allocation refuses the pod. The error of an allocation
// that cannot be made wraps ErrUnsatisfiable and says, per device the
// allocator looked at, why it was not taken.
func Allocate(ctx context.Context, client kubernetes.Interface, nodeName string, pod *corev1.Pod) error {
	claims, err := podClaims(ctx, client, pod)
	if err != nil || len(claims) == 0 {
		return err
	}
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// An emulated node need not exist in the API server: it is the
		// node its drivers publish slices for.
		node = &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	case err != nil:
		return fmt.Errorf("get Node %s: %w", nodeName, err)
	}
	var pending []*resourcev1.ResourceClaim
	for _, c := range claims {
		if c.Status.Allocation == nil {
			pending = append(pending, c)
			continue
		}
		ok, err := structured.NodeMatches(Features, node, "", false, c.Status.Allocation.NodeSelector)
		if err != nil {
			return fmt.Errorf("ResourceClaim %s/%s: its allocation's node selector: %w", c.Namespace, c.Name, err)
		}
		if !ok {
			return fmt.Errorf("ResourceClaim %s/%s is allocated for another node than %s; delete the pods using it so that it is deallocated, or admit the pod on that node", c.Namespace, c.Name, nodeName)
		}
	}
	if len(pending) > 0 {
		results, err := allocate(ctx, client, node, pending)
		if err != nil {
			return err
		}
		for i, c := range pending {
			c.Status.Allocation = &results[i]
		}
	}
	var done []*resourcev1.ResourceClaim
	for _, c := range claims {
		if err := reserve(ctx, client, c, pod); err != nil {
			// Leave nothing half done: what this call reserved and
			// allocated is released again.
			for _, d := range done {
				_ = unreserve(ctx, client, d, pod)
			}
			return err
		}
		done = append(done, c)
	}
	return nil
}

// Release removes the pod's reservation from each of its claims, and
// deallocates a claim then reserved for no pod. A claim that is gone is
// fine.
func Release(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) error {
	var errs []error
	for _, name := range claimNames(pod) {
		c, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("get ResourceClaim %s/%s: %w", pod.Namespace, name, err))
			continue
		}
		if err := unreserve(ctx, client, c, pod); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// claimNames are the names of the claims the pod uses: those it names,
// and those generated for its templates that its status records.
func claimNames(pod *corev1.Pod) []string {
	var out []string
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out = append(out, *rc.ResourceClaimName)
			continue
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == rc.Name && st.ResourceClaimName != nil {
				out = append(out, *st.ResourceClaimName)
			}
		}
	}
	return out
}

func podClaims(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) ([]*resourcev1.ResourceClaim, error) {
	var out []*resourcev1.ResourceClaim
	for i, rc := range pod.Spec.ResourceClaims {
		name := ""
		switch {
		case rc.ResourceClaimName != nil:
			name = *rc.ResourceClaimName
		default:
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == rc.Name && st.ResourceClaimName != nil {
					name = *st.ResourceClaimName
				}
			}
		}
		if name == "" {
			return nil, fmt.Errorf("spec.resourceClaims[%d] (%s): a claim from resourceClaimTemplateName is created by kube-controller-manager, which dpkit admit does not run; create the ResourceClaim and name it in resourceClaimName", i, rc.Name)
		}
		c, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("spec.resourceClaims[%d] (%s): get ResourceClaim %s/%s: %w", i, rc.Name, pod.Namespace, name, err)
		}
		out = append(out, c)
	}
	return out, nil
}

// allocate runs the scheduler's allocator for claims on node, against the
// devices every other claim holds.
func allocate(ctx context.Context, client kubernetes.Interface, node *corev1.Node, claims []*resourcev1.ResourceClaim) ([]resourcev1.AllocationResult, error) {
	sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	dc, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	all, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for i := range all.Items {
		addAllocated(&state, &all.Items[i])
	}
	slicePtrs := make([]*resourcev1.ResourceSlice, len(sl.Items))
	for i := range sl.Items {
		slicePtrs[i] = &sl.Items[i]
	}
	why := &reasons{}
	ctx = klog.NewContext(ctx, logr.New(why))
	a, err := structured.NewAllocator(ctx, Features, state, classes(dc.Items), slicePtrs,
		cel.NewCache(10, cel.Features{EnableConsumableCapacity: Features.ConsumableCapacity}))
	if err != nil {
		return nil, fmt.Errorf("the allocator: %w", err)
	}
	results, err := a.Allocate(ctx, node, claims)
	if err != nil {
		return nil, fmt.Errorf("allocating %s on node %s: %w", claimList(claims), node.Name, err)
	}
	if results == nil {
		return nil, fmt.Errorf("%w on node %s: %s: %s", ErrUnsatisfiable, node.Name, claimList(claims), why.String(len(sl.Items)))
	}
	return results, nil
}

// addAllocated records the devices a claim's allocation holds; an
// admin-access result holds none.
func addAllocated(state *structured.AllocatedState, c *resourcev1.ResourceClaim) {
	if c.Status.Allocation == nil {
		return
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.AdminAccess != nil && *r.AdminAccess {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID == nil {
			state.AllocatedDevices.Insert(id)
			continue
		}
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
		if r.ConsumedCapacity != nil {
			state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
		}
	}
}

func claimList(claims []*resourcev1.ResourceClaim) string {
	names := make([]string, len(claims))
	for i, c := range claims {
		names[i] = "ResourceClaim " + c.Namespace + "/" + c.Name
	}
	return strings.Join(names, ", ")
}

// reserve writes the pod into the claim's reservedFor (and the allocation
// with the scheduler's finalizer, when this call made it).
func reserve(ctx context.Context, client kubernetes.Interface, c *resourcev1.ResourceClaim, pod *corev1.Pod) error {
	api := client.ResourceV1().ResourceClaims(c.Namespace)
	if !slices.Contains(c.Finalizers, Finalizer) {
		c.Finalizers = append(c.Finalizers, Finalizer)
		allocation := c.Status.Allocation
		updated, err := api.Update(ctx, c, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("ResourceClaim %s/%s: add finalizer %s: %w", c.Namespace, c.Name, Finalizer, err)
		}
		updated.Status.Allocation = allocation
		c = updated
	}
	for _, r := range c.Status.ReservedFor {
		if r.UID == pod.UID {
			if _, err := api.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("ResourceClaim %s/%s: write the allocation: %w", c.Namespace, c.Name, err)
			}
			return nil
		}
	}
	if len(c.Status.ReservedFor) >= resourcev1.ResourceClaimReservedForMaxSize {
		return fmt.Errorf("ResourceClaim %s/%s is reserved for %d pods, the most it can be", c.Namespace, c.Name, len(c.Status.ReservedFor))
	}
	c.Status.ReservedFor = append(c.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
	if _, err := api.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("ResourceClaim %s/%s: reserve it for pod %s: %w", c.Namespace, c.Name, pod.Name, err)
	}
	return nil
}

// unreserve removes the pod from the claim's reservedFor; a claim then
// reserved for no pod loses its allocation and the finalizer, as the
// resourceclaim controller does.
func unreserve(ctx context.Context, client kubernetes.Interface, c *resourcev1.ResourceClaim, pod *corev1.Pod) error {
	api := client.ResourceV1().ResourceClaims(c.Namespace)
	c = c.DeepCopy()
	c.Status.ReservedFor = slices.DeleteFunc(c.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool { return r.UID == pod.UID })
	if len(c.Status.ReservedFor) == 0 {
		c.Status.Allocation = nil
		c.Status.Devices = nil
	}
	updated, err := api.UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("ResourceClaim %s/%s: release it from pod %s: %w", c.Namespace, c.Name, pod.Name, err)
	}
	if updated.Status.Allocation == nil && slices.Contains(updated.Finalizers, Finalizer) {
		updated.Finalizers = slices.DeleteFunc(updated.Finalizers, func(f string) bool { return f == Finalizer })
		if _, err := api.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("ResourceClaim %s/%s: remove finalizer %s: %w", c.Namespace, c.Name, Finalizer, err)
		}
	}
	return nil
}

// classes lists DeviceClasses for the allocator.
type classes []resourcev1.DeviceClass

func (l classes) List() ([]*resourcev1.DeviceClass, error) {
	out := make([]*resourcev1.DeviceClass, len(l))
	for i := range l {
		out[i] = &l[i]
	}
	return out, nil
}

func (l classes) Get(name string) (*resourcev1.DeviceClass, error) {
	for i := range l {
		if l[i].Name == name {
			return &l[i], nil
		}
	}
	return nil, fmt.Errorf("DeviceClass %s not found", name)
}

// reasons is a logr sink that keeps what the allocator says about each
// device it looked at and did not take (its V(7) messages), to explain
// an allocation that could not be made.
type reasons struct {
	mu       sync.Mutex
	byReason map[string][]string // message -> devices
	order    []string
}

// Messages of the allocator about a device it did not take, in words for
// the user.
var deviceReasons = map[string]string{
	"Device in use":                      "allocated to another claim",
	"Device in use in same claim":        "taken by another request of the claim",
	"Device not selectable":              "not selected by the DeviceClass or the request's selectors",
	"Device not usable":                  "tainted (NoSchedule or NoExecute) and not tolerated",
	"Insufficient counters":              "its shared counters are used up",
	"Device removed from constraint set": "",
}

func (r *reasons) Init(logr.RuntimeInfo)          {}
func (r *reasons) Enabled(int) bool               { return true }
func (r *reasons) Error(error, string, ...any)    {}
func (r *reasons) WithName(string) logr.LogSink   { return r }
func (r *reasons) WithValues(...any) logr.LogSink { return r }

func (r *reasons) Info(_ int, msg string, kv ...any) {
	why, ok := deviceReasons[msg]
	if !ok || why == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i+1 < len(kv); i += 2 {
		if k, _ := kv[i].(string); k == "device" {
			if r.byReason == nil {
				r.byReason = map[string][]string{}
			}
			dev := fmt.Sprint(kv[i+1])
			if !slices.Contains(r.byReason[why], dev) {
				if len(r.byReason[why]) == 0 {
					r.order = append(r.order, why)
				}
				r.byReason[why] = append(r.byReason[why], dev)
			}
		}
	}
}

// String says why no allocation was found.
func (r *reasons) String(published int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.order) == 0 {
		if published == 0 {
			return "no ResourceSlice is published (is the DRA driver running and registered?)"
		}
		return "no published device of this node matches the claims' DeviceClasses (check the class names, and that the driver publishes for this node)"
	}
	parts := make([]string, 0, len(r.order))
	for _, why := range r.order {
		devs := r.byReason[why]
		sort.Strings(devs)
		parts = append(parts, fmt.Sprintf("%s: %s", why, strings.Join(devs, ", ")))
	}
	return "devices looked at and not taken: " + strings.Join(parts, "; ")
}
