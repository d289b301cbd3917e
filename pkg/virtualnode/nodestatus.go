package virtualnode

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

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

// takeNode takes the Node an earlier run of this node left: the
// device-plugin resources it applied are remembered, and the status is
// written over it, changed or not (virtual-kubelet's node controller
// writes none for a Node it was handed by a Create).
func (n *Node) takeNode(node *corev1.Node) {
	n.rememberPluginResources(node)
	n.mu.Lock()
	n.stale = true
	n.mu.Unlock()
	n.kickStatus()
}

// rememberPluginResources adds to pluginResources the extended resources
// that an earlier run of this node applied to node and that are not
// declared: device-plugin resources, kept at zero after a restart like
// the kubelet keeps them on its Node. Without them virtual-kubelet's
// patch would remove them. Resources set on the Node by others are left
// alone.
func (n *Node) rememberPluginResources(node *corev1.Node) {
	var applied corev1.NodeStatus
	if a, ok := node.Annotations[lastAppliedStatus]; !ok || json.Unmarshal([]byte(a), &applied) != nil {
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

// kickStatus asks sendStatus to send the node's status, starting it when
// it does not run (and the node does).
func (n *Node) kickStatus() {
	select {
	case n.statusKick <- struct{}{}:
	default: // one is pending; it will read the status when it runs
	}
	n.status.Ensure()
}

// statusPending says whether a send is pending, without taking it.
func (n *Node) statusPending() bool { return len(n.statusKick) > 0 }

// sendStatus hands virtual-kubelet the node's status, computed when it is
// sent, each time it is asked (kickStatus) and it changed: one goroutine
// sends, and each send carries everything before it, so no change is lost
// (a change before virtual-kubelet gave its callback, or while a send
// waited) nor overtaken by an older status. It returns when no send is
// pending (kickStatus starts it again: ondemand.Loop) or ctx ends: a
// node whose status does not change has no goroutine for it, one fewer
// for each of the thousand nodes of a process.
func (n *Node) sendStatus(ctx context.Context) {
	for !n.status.Idle(n.statusPending) {
		<-n.statusKick // this goroutine alone takes it
		// Changes that come together, as a plugin's registration and
		// its first list of devices, go in one write: the status is
		// read StatusCoalesce after the first of them. (The kubelet
		// writes it at most every 10 s.)
		coalesce := time.NewTimer(StatusCoalesce)
		select {
		case <-ctx.Done():
			coalesce.Stop()
			return
		case <-coalesce.C:
		}
		select {
		case <-n.statusKick: // read below
		default:
		}
		n.sendChanged(ctx)
	}
}

// markSent records the Node as registered: the status virtual-kubelet
// writes first, with the Node, or over a Node left by an earlier run.
func (n *Node) markSent(node *corev1.Node) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.sentCapacity, n.sentAllocatable = node.Status.Capacity.DeepCopy(), node.Status.Allocatable.DeepCopy()
}

// sendChanged hands virtual-kubelet the node's status if its capacity or
// allocatable differ from what it was last handed (markSent), and says
// whether it did. An unchanged status is not written again: the node's
// heartbeat is its Lease, and virtual-kubelet writes the status every
// StatusUpdateInterval regardless, as the kubelet does every
// nodeStatusReportFrequency.
func (n *Node) sendChanged(ctx context.Context) bool {
	c, a := n.resources()
	n.mu.Lock()
	cb := n.notifyCB
	if cb == nil || !n.stale && sameQuantities(c, n.sentCapacity) && sameQuantities(a, n.sentAllocatable) {
		n.mu.Unlock()
		return false // with no callback yet, NotifyNodeStatus kicks again
	}
	n.node.Status.Capacity, n.node.Status.Allocatable = c, a
	n.node.Status.Conditions = conditions()
	n.sentCapacity, n.sentAllocatable, n.stale = c.DeepCopy(), a.DeepCopy(), false
	node := n.node.DeepCopy()
	n.mu.Unlock()
	n.log.Debug("Sending the node status", "allocatable", a)
	notifyNode(ctx, cb, node)
	return true
}

// sameQuantities says whether a and b hold the same resources in the same
// amounts.
func sameQuantities(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
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

// devicesChanged has the node status sent after the device manager's
// resources changed (watchHealth calls it).
func (n *Node) devicesChanged(ctx context.Context) {
	n.kickStatus()
	dc, _ := n.mgr.Capacity()
	n.warnServedBothWays(ctx, n.newPluginNames(dc))
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
	for attempt := 0; attempt < 5; attempt++ {
		// The Node as registered, from the node cache the first time
		// (no request), from the API server after a failed attempt.
		cur, err := n.nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			if ctx.Err() == nil {
				n.log.Warn("Reading node to remove start-up taints", "err", err)
			}
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
		patch, err := taintsPatch(cur.Spec.Taints, keep)
		if err != nil {
			n.log.Warn("Could not remove start-up taints", "err", err)
			return
		}
		updated, err := n.cfg.Client.CoreV1().Nodes().Patch(ctx, n.cfg.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		if _, err := n.nodes.keep(updated, err); err == nil {
			n.log.Info("Removed start-up taints")
			return
		}
		// A test that failed (the taints changed since they were
		// read) is a 422 or a conflict: read them again.
		if ctx.Err() != nil {
			return // the node stops
		}
		if !isConflict(err) && !apierrors.IsInvalid(err) && !isUnprocessable(err) {
			n.log.Warn("Could not remove start-up taints; pods must tolerate node.kubernetes.io/not-ready or kube-controller-manager must run", "err", err)
			return
		}
	}
}

// taintsPatch is a JSON patch that replaces the taints was with keep,
// only if they are still was: other taints that others add or remove
// meanwhile are never lost, and the patch does not fail on the status
// writes that change the Node's resourceVersion all the time.
func taintsPatch(was, keep []corev1.Taint) ([]byte, error) {
	ops := []map[string]any{{"op": "test", "path": "/spec/taints", "value": was}}
	if len(keep) == 0 {
		ops = append(ops, map[string]any{"op": "remove", "path": "/spec/taints"})
	} else {
		ops = append(ops, map[string]any{"op": "replace", "path": "/spec/taints", "value": keep})
	}
	return json.Marshal(ops)
}

func isUnprocessable(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 422
}

func isConflict(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 409
}
