package virtualnode

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"runtime"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/devicehost"
)

// The Node object: what the node registers, its status (capacity from
// the declared resources and the device manager's) and how changes reach
// virtual-kubelet's node controller.

// nodeObject builds the Node as registered: labels, taints, addresses,
// daemon endpoint, capacity and a Ready condition.
func (n *Node) nodeObject() *corev1.Node {
	cfg := n.cfg
	labels := map[string]string{
		"type":                   "virtual-kubelet",
		"kubernetes.io/role":     "agent",
		"kubernetes.io/hostname": cfg.Name,
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     runtime.GOARCH,
		"dpkit.io/virtual-node":  "true",
	}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: cfg.Taints},
		Status: corev1.NodeStatus{
			NodeInfo: corev1.NodeSystemInfo{
				OperatingSystem: "linux",
				Architecture:    runtime.GOARCH,
				KubeletVersion:  KubeletVersion,
			},
			Addresses:       addresses(cfg),
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(max(cfg.Port, 0))}},
			Conditions:      conditions(),
		},
	}
	node.Status.Capacity, node.Status.Allocatable = n.resources()
	return node
}

// addresses are the node's InternalIP and its Hostname: the machine's
// name, as a kubelet reports it, which resolves where the node name need
// not.
func addresses(cfg Config) []corev1.NodeAddress {
	return []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: cfg.NodeIP},
		{Type: corev1.NodeHostName, Address: cmp.Or(cfg.Hostname, DefaultHostname())},
	}
}

func conditions() []corev1.NodeCondition {
	now := metav1.Now()
	c := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return []corev1.NodeCondition{
		c(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "dpkit virtual node is posting ready status"),
		c(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "dpkit virtual node has sufficient memory available"),
		c(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "dpkit virtual node has no disk pressure"),
		c(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "dpkit virtual node has sufficient PID available"),
	}
}

// resources merges the declared resources with the device manager's. A
// device-plugin resource the device manager removed (its plugins stayed
// away for the grace period) reads zero capacity and allocatable rather
// than disappearing: the kubelet sets the capacity of the resources
// GetCapacity reports deleted to 0 "to indicate that the resource is
// managed by device plugin and had been registered before", and its
// allocatable follows (pkg/kubelet/nodestatus.MachineInfo); the Node keeps
// them until a plugin registers the resource again.
func (n *Node) resources() (capacity, allocatable corev1.ResourceList) {
	capacity, allocatable = corev1.ResourceList{}, corev1.ResourceList{}
	for k, v := range n.cfg.Resources {
		capacity[k] = v.DeepCopy()
		allocatable[k] = v.DeepCopy()
	}
	dc, da := n.mgr.Capacity()
	for k, v := range dc {
		capacity[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	for k, v := range da {
		allocatable[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for k := range dc {
		n.pluginResources[corev1.ResourceName(k)] = true
	}
	for k := range n.pluginResources {
		if _, ok := dc[string(k)]; !ok {
			capacity[k] = *resource.NewQuantity(0, resource.DecimalSI)
			allocatable[k] = *resource.NewQuantity(0, resource.DecimalSI)
		}
	}
	return capacity, allocatable
}

// lastAppliedStatus is the annotation in which virtual-kubelet's node
// controller keeps the status it last applied (the base of its three-way
// patches).
const lastAppliedStatus = "virtual-kubelet.io/last-applied-node-status"

// rememberPluginResources adds to pluginResources the extended resources
// that an earlier run of this node applied and that are not declared:
// device-plugin resources, kept at zero after a restart like the kubelet
// keeps them on its Node. Without them virtual-kubelet's patch would
// remove them. Resources set on the Node by others are left alone.
func (n *Node) rememberPluginResources(ctx context.Context) {
	cur, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			n.log.Warn("Reading the node's last status; device-plugin resources removed before this run may leave it", "err", err)
		}
		return
	}
	var applied corev1.NodeStatus
	if a, ok := cur.Annotations[lastAppliedStatus]; !ok || json.Unmarshal([]byte(a), &applied) != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for k := range applied.Capacity {
		if _, declared := n.cfg.Resources[k]; !declared && devicehost.IsExtendedResourceName(string(k)) {
			n.pluginResources[k] = true
		}
	}
}

// Ping implements node.NodeProvider.
func (n *Node) Ping(ctx context.Context) error { return ctx.Err() }

// NotifyNodeStatus implements node.NodeProvider. What changed before
// virtual-kubelet asked is sent now.
func (n *Node) NotifyNodeStatus(_ context.Context, cb func(*corev1.Node)) {
	n.mu.Lock()
	n.notifyCB = cb
	n.mu.Unlock()
	n.kickStatus()
}

// kickStatus asks sendStatus to send the node's status.
func (n *Node) kickStatus() {
	select {
	case n.statusKick <- struct{}{}:
	default: // one is pending; it will read the status when it runs
	}
}

// sendStatus hands virtual-kubelet the node's status, computed when it is
// sent, each time it is asked (kickStatus): one goroutine sends, and each
// send carries everything before it, so no change is lost (a change before
// virtual-kubelet gave its callback, or while a send waited) nor overtaken
// by an older status.
func (n *Node) sendStatus(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.statusKick:
		}
		c, a := n.resources()
		n.mu.Lock()
		n.node.Status.Capacity, n.node.Status.Allocatable = c, a
		n.node.Status.Conditions = conditions()
		node := n.node.DeepCopy()
		cb := n.notifyCB
		n.mu.Unlock()
		if cb == nil {
			continue // NotifyNodeStatus kicks again
		}
		n.log.Debug("Sending the node status", "allocatable", a)
		notifyNode(ctx, cb, node)
	}
}

// notifyNode hands node to virtual-kubelet's node controller through the
// callback it gave NotifyNodeStatus. The callback sends on a channel of one
// that only the controller's loop reads, so once that loop has ended (the
// node stopping) a send blocks for ever: it runs on a goroutine of its
// own, and notifyNode returns when it is done or ctx is. A send left
// blocked by a stopped controller is the one goroutine a stopped node can
// leave behind.
func notifyNode(ctx context.Context, cb func(*corev1.Node), node *corev1.Node) {
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		cb(node)
	}()
	select {
	case <-sent:
	case <-ctx.Done():
	}
}

// watchDevices has the node status sent whenever the device manager's
// resources change.
func (n *Node) watchDevices(ctx context.Context, ch <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-ch:
			if !ok {
				return
			}
		}
		n.kickStatus()
		dc, _ := n.mgr.Capacity()
		n.warnServedBothWays(ctx, n.newPluginNames(dc))
	}
}

// startupTaints are the taints the API server's TaintNodesByCondition
// admission puts on a new node and that the node lifecycle controller
// removes once the node is Ready. A virtual node removes them itself, so it
// works on control planes without kube-controller-manager. Where the
// node's credentials are a node identity restricted by NodeRestriction
// this is refused and logged: kube-controller-manager removes them there.
var startupTaints = map[string]bool{
	"node.kubernetes.io/not-ready":   true,
	"node.kubernetes.io/unreachable": true,
}

func (n *Node) removeStartupTaints(ctx context.Context) {
	nodes := n.cfg.Client.CoreV1().Nodes()
	for attempt := 0; attempt < 5; attempt++ {
		cur, err := nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			n.log.Warn("Reading node to remove start-up taints", "err", err)
			return
		}
		var keep []corev1.Taint
		for _, t := range cur.Spec.Taints {
			if !startupTaints[t.Key] {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(cur.Spec.Taints) {
			return
		}
		cur.Spec.Taints = keep
		_, err = nodes.Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			n.log.Info("Removed start-up taints")
			return
		}
		if !isConflict(err) {
			n.log.Warn("Could not remove start-up taints; pods must tolerate node.kubernetes.io/not-ready or kube-controller-manager must run", "err", err)
			return
		}
	}
}

func isConflict(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 409
}
