package dra

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/internal/backoff"
)

// Devices per ResourceSlice: the API's limits.
const (
	MaxDevicesPerSlice        = resourcev1.ResourceSliceMaxDevices
	MaxDevicesPerSliceTainted = resourcev1.ResourceSliceMaxDevicesWithAdvancedFeatures
)

// ResyncPeriod is how often the driver checks its ResourceSlices against
// the API server even when nothing changed: the kubelet deletes a driver's
// slices when it starts and 30 s after the driver goes, and anyone may
// delete them.
const ResyncPeriod = time.Minute

// publishLoop publishes the devices on every change that alters them,
// retrying failures with back-off, and again (a no-op when the API server
// has them) each time the kubelet registers the driver and every
// ResyncPeriod.
func (d *Driver) publishLoop(ctx context.Context) {
	ch, stop := d.inv.Watch()
	defer stop()
	resync := d.cfg.Clock.NewTicker(ResyncPeriod)
	defer resync.Stop()
	b := backoff.Retry{Exponential: backoff.Exponential{Initial: time.Second, Max: time.Minute}, Jitter: true}
	var last []resourcev1.Device
	published := false
	var retry <-chan time.Time
	for {
		if devs, known := d.sliceDevices(); known && (!published || !apiequality.Semantic.DeepEqual(devs, last)) {
			if err := d.cfg.Slices.Publish(ctx, d.cfg.PoolName, devs); err != nil {
				if ctx.Err() != nil {
					return
				}
				wait := b.Next()
				d.log.Error("Publishing ResourceSlices failed; retrying", "err", err, "retryIn", wait)
				d.metrics.publishes.WithLabelValues("error").Inc()
				retry = d.cfg.Clock.After(wait)
			} else {
				d.metrics.publishes.WithLabelValues("success").Inc()
				d.log.Debug("ResourceSlices published", "devices", len(devs))
				b.Reset()
				last, published, retry = devs, true, nil
			}
		}
		registered := d.RegistrationChanged()
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-retry:
		case <-registered:
			published = false
		case <-resync.C():
			if retry == nil { // a pending retry publishes anyway
				published = false
			}
		}
	}
}

// APIClaims reads claims from the API server.
func APIClaims(client kubernetes.Interface) ClaimGetter { return apiClaims{client} }

type apiClaims struct{ client kubernetes.Interface }

func (a apiClaims) GetResourceClaim(ctx context.Context, namespace, name string) (*resourcev1.ResourceClaim, error) {
	return a.client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
}

// APISlices publishes a driver's devices on one node as ResourceSlices:
// named <node>-<driver>-<index> (shortened with a hash when too long),
// owned by the Node (deleted with it), spec.nodeName set, at most 128
// devices per slice (64 when a device has taints), every slice carrying
// the pool's generation, bumped on each change, and the pool's slice
// count. Slices of the driver and node it did not write are deleted.
func APISlices(client kubernetes.Interface, driver, node string) SlicePublisher {
	return &apiSlices{client: client, driver: driver, node: node}
}

type apiSlices struct {
	client       kubernetes.Interface
	driver, node string

	mu      sync.Mutex
	nodeUID string
}

// SliceName returns the name of a driver's index-th ResourceSlice on a
// node.
func SliceName(node, driver string, index int) string {
	name := fmt.Sprintf("%s-%s-%d", node, driver, index)
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(node + "/" + driver))
	return fmt.Sprintf("%s-%s-%d", node[:min(len(node), 200)], hex.EncodeToString(sum[:8]), index)
}

// SplitDevices cuts devices into the slices they are published in.
func SplitDevices(devices []resourcev1.Device) [][]resourcev1.Device {
	per := MaxDevicesPerSlice
	for _, d := range devices {
		if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 {
			per = MaxDevicesPerSliceTainted
			break
		}
	}
	if len(devices) == 0 {
		return [][]resourcev1.Device{nil} // an empty pool is published as one empty slice
	}
	var out [][]resourcev1.Device
	for i := 0; i < len(devices); i += per {
		out = append(out, devices[i:min(i+per, len(devices))])
	}
	return out
}

func (a *apiSlices) ownerUID(ctx context.Context) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.nodeUID != "" {
		return a.nodeUID, nil
	}
	n, err := a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get Node %s for the ResourceSlices' owner: %w", a.node, err)
	}
	a.nodeUID = string(n.UID)
	return a.nodeUID, nil
}

func (a *apiSlices) Publish(ctx context.Context, pool string, devices []resourcev1.Device) error {
	uid, err := a.ownerUID(ctx)
	if err != nil {
		return err
	}
	api := a.client.ResourceV1().ResourceSlices()
	list, err := api.List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
		resourcev1.ResourceSliceSelectorNodeName: a.node, resourcev1.ResourceSliceSelectorDriver: a.driver,
	}.String()})
	if err != nil {
		return fmt.Errorf("list ResourceSlices of %s on %s: %w", a.driver, a.node, err)
	}
	existing := map[string]*resourcev1.ResourceSlice{}
	var generation int64
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.Driver != a.driver || ptr.Deref(s.Spec.NodeName, "") != a.node {
			continue // a fake clientset ignores field selectors
		}
		existing[s.Name] = s
		if s.Spec.Pool.Name == pool {
			generation = max(generation, s.Spec.Pool.Generation)
		}
	}
	parts := SplitDevices(devices)
	want := make([]*resourcev1.ResourceSlice, len(parts))
	same := len(existing) == len(parts)
	for i, devs := range parts {
		s := &resourcev1.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: SliceName(a.node, a.driver, i),
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: a.node, UID: types.UID(uid), Controller: ptr.To(true),
				}},
			},
			Spec: resourcev1.ResourceSliceSpec{
				Driver:   a.driver,
				Pool:     resourcev1.ResourcePool{Name: pool, ResourceSliceCount: int64(len(parts))},
				NodeName: ptr.To(a.node),
				Devices:  devs,
			},
		}
		want[i] = s
		old, ok := existing[s.Name]
		if !ok || !sameSlice(old, s) {
			same = false
		}
	}
	if same {
		return nil
	}
	generation++
	for _, s := range want {
		s.Spec.Pool.Generation = generation
		old, ok := existing[s.Name]
		if ok {
			old = old.DeepCopy()
			old.OwnerReferences, old.Spec = s.OwnerReferences, s.Spec
			_, err = api.Update(ctx, old, metav1.UpdateOptions{})
		} else {
			_, err = api.Create(ctx, s, metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("write ResourceSlice %s: %w", s.Name, err)
		}
		delete(existing, s.Name)
	}
	for name := range existing {
		if err := api.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ResourceSlice %s: %w", name, err)
		}
	}
	return nil
}

// sameSlice reports whether an existing slice already says what want
// says, apart from the generation; the API server's timeAdded of a taint
// is not a difference.
func sameSlice(old, want *resourcev1.ResourceSlice) bool {
	o := old.Spec.DeepCopy()
	o.Pool.Generation = 0
	for i := range o.Devices {
		for j := range o.Devices[i].Taints {
			o.Devices[i].Taints[j].TimeAdded = nil
		}
	}
	return apiequality.Semantic.DeepEqual(*o, want.Spec) && apiequality.Semantic.DeepEqual(old.OwnerReferences, want.OwnerReferences)
}
