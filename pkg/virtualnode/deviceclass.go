package virtualnode

import (
	"context"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// extendedResourceName returns the extended resource name a DeviceClass
// gives its devices: spec.extendedResourceName, or the implicit
// deviceclass.resource.kubernetes.io/<class>.
func extendedResourceName(dc *resourcev1.DeviceClass) string {
	if dc.Spec.ExtendedResourceName != nil && *dc.Spec.ExtendedResourceName != "" {
		return *dc.Spec.ExtendedResourceName
	}
	return resourcev1.ResourceDeviceClassPrefix + dc.Name
}

// warnServedBothWays logs a warning for each of names, device-plugin
// resources new on the node, that a DeviceClass also maps to DRA. A node
// must not advertise one name both ways (KEP-5004); the kubelet does
// nothing about it, and neither does the node: the scheduler's rule
// (v1.37) serves the name on this node by the device plugin while its
// allocatable is above zero, and by DRA only when it is zero. The check
// is one List of DeviceClasses each time new names register (nodes of
// one process share one, DeviceClasses); a node
// identity may not read DeviceClasses (the system:node role has no rule
// for them), and is told once at debug level.
func (n *Node) warnServedBothWays(ctx context.Context, names []string) {
	if len(names) == 0 {
		return
	}
	classes := n.cfg.DeviceClasses
	if classes == nil {
		classes = NewDeviceClasses(n.cfg.Client)
	}
	list, err := classes.list(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		if apierrors.IsForbidden(err) || apierrors.IsNotFound(err) {
			n.classesOnce.Do(func() {
				n.log.Debug("Cannot read DeviceClasses to check that no device-plugin resource is also DRA-backed", "err", err)
			})
			return
		}
		n.log.Warn("Reading DeviceClasses to check that no device-plugin resource is also DRA-backed", "err", err)
		return
	}
	for i := range list {
		dc := &list[i]
		rn := extendedResourceName(dc)
		if !slices.Contains(names, rn) {
			continue
		}
		n.log.Warn("A device plugin serves an extended resource that a DeviceClass maps to DRA; a node must not advertise one name both ways. "+
			"The scheduler serves it on this node by the device plugin while its allocatable is above zero, by DRA when it is zero",
			"resource", rn, "deviceClass", dc.Name)
	}
}

// newPluginNames returns the device-plugin resources in capacity that
// warnServedBothWays has not checked yet, and marks them checked.
func (n *Node) newPluginNames(capacity map[string]int64) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.classChecked == nil {
		n.classChecked = map[string]bool{}
	}
	var out []string
	for rn := range capacity {
		if !n.classChecked[rn] {
			n.classChecked[rn] = true
			out = append(out, rn)
		}
	}
	slices.Sort(out)
	return out
}

// DeviceClasses reads the cluster's DeviceClasses for the check of
// warnServedBothWays. Nodes of one process share one: a List answers
// every node that asks within DeviceClassesMaxAge of it, so 1 000
// nodes starting together make a few Lists, not 1 000.
type DeviceClasses struct {
	client kubernetes.Interface
	group  singleflight.Group

	mu      sync.Mutex
	at      time.Time
	classes []resourcev1.DeviceClass
}

// DeviceClassesMaxAge is how long a List of DeviceClasses answers for.
const DeviceClassesMaxAge = 10 * time.Second

// NewDeviceClasses reads DeviceClasses through client.
func NewDeviceClasses(client kubernetes.Interface) *DeviceClasses {
	return &DeviceClasses{client: client}
}

func (d *DeviceClasses) list(ctx context.Context) ([]resourcev1.DeviceClass, error) {
	d.mu.Lock()
	if !d.at.IsZero() && time.Since(d.at) < DeviceClassesMaxAge {
		defer d.mu.Unlock()
		return d.classes, nil
	}
	d.mu.Unlock()
	v, err, _ := d.group.Do("", func() (any, error) {
		// Other nodes wait on this List: it must not end with the
		// first asker's context.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), HeartbeatTimeout)
		defer cancel()
		list, err := d.client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		d.at, d.classes = time.Now(), list.Items
		return list.Items, nil
	})
	if err != nil {
		return nil, err
	}
	return v.([]resourcev1.DeviceClass), nil
}
