package draverify

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// The driver's ResourceSlices for the node: dra.slices.valid, and the
// helpers that wait for complete pools and list their devices.

// slicesNow lists the driver's ResourceSlices for the node: by
// spec.nodeName, spec.nodeSelector, spec.allNodes or
// spec.perDeviceNodeSelection (nodeslices.go).
func (r *run) slicesNow(ctx context.Context) ([]resourcev1.ResourceSlice, error) {
	l, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorDriver + "=" + r.driver})
	if err != nil {
		return nil, err
	}
	return forNode(l.Items, r.nodeObject(ctx)), nil
}

// complete reports whether slices form complete pools of one generation.
func complete(sl []resourcev1.ResourceSlice) bool {
	if len(sl) == 0 {
		return false
	}
	type key struct {
		pool string
		gen  int64
	}
	count := map[key]int64{}
	want := map[key]int64{}
	newest := map[string]int64{}
	for _, s := range sl {
		k := key{s.Spec.Pool.Name, s.Spec.Pool.Generation}
		count[k]++
		want[k] = s.Spec.Pool.ResourceSliceCount
		newest[k.pool] = max(newest[k.pool], k.gen)
	}
	for pool, gen := range newest {
		k := key{pool, gen}
		if count[k] != want[k] {
			return false
		}
	}
	return true
}

// waitSlices waits up to d for complete pools of the driver's slices.
func (r *run) waitSlices(ctx context.Context, d time.Duration, ok func([]resourcev1.ResourceSlice) bool) ([]resourcev1.ResourceSlice, error) {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		sl, err := r.slicesNow(ctx)
		if err == nil && ok(sl) {
			return sl, nil
		}
		if time.Now().After(deadline) {
			return sl, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
}

func (r *run) checkSlices(ctx context.Context) bool {
	wait := 2 * r.cfg.CallTimeout
	sl, err := r.waitSlices(ctx, wait, complete)
	if err == nil && len(sl) > 0 {
		// Judged once the driver is done publishing.
		r.settle(ctx, time.Time{})
		sl, err = r.slicesNow(ctx)
	}
	if err != nil {
		r.set(verify.CheckDRASlices, verify.Fail, "listing the ResourceSlices: %v", err)
		return r.stop("no devices: see " + verify.CheckDRASlices)
	}
	if len(sl) == 0 {
		r.set(verify.CheckDRASlices, verify.Fail, "no ResourceSlice of driver %s for node %s (by spec.nodeName, spec.nodeSelector, spec.allNodes or spec.perDeviceNodeSelection) within %s%s", r.driver, r.node, wait, r.elsewhere(ctx))
		return r.stop("no devices: see " + verify.CheckDRASlices)
	}
	node := r.nodeObject(ctx)
	var problems, how []string
	pools := map[string]bool{}
	for _, s := range sl {
		if n := len(s.Spec.Devices); n > resourcev1.ResourceSliceMaxDevices {
			problems = append(problems, fmt.Sprintf("%s has %d devices (at most %d)", s.Name, n, resourcev1.ResourceSliceMaxDevices))
		}
		if h := nodeSelection(&s); !slices.Contains(how, h) {
			how = append(how, h)
		}
		// The kubelet removes a node's slices by spec.nodeName and the
		// Node's deletion removes what it owns; a slice that selects its
		// nodes otherwise is neither's.
		owned := slices.ContainsFunc(s.OwnerReferences, func(o metav1.OwnerReference) bool { return o.Kind == "Node" && o.Name == r.node })
		if s.Spec.NodeName != nil && !owned {
			problems = append(problems, fmt.Sprintf("%s (spec.nodeName %s) is not owned by Node %s (ownerReferences)", s.Name, *s.Spec.NodeName, r.node))
		}
		pools[s.Spec.Pool.Name] = true
	}
	if !complete(sl) {
		problems = append(problems, "the pool's slices disagree on generation or resourceSliceCount")
	}
	// The checks prepare devices of the first pool with devices for the
	// node.
	sort.Slice(sl, func(i, j int) bool { return sl[i].Name < sl[j].Name })
	r.pool = sl[0].Spec.Pool.Name
	for _, s := range sl {
		if len(deviceNames([]resourcev1.ResourceSlice{s}, s.Spec.Pool.Name, node)) > 0 {
			r.pool = s.Spec.Pool.Name
			break
		}
	}
	r.generation = newestGeneration(sl, r.pool)
	r.devices = deviceNames(sl, r.pool, node)
	for _, d := range listedTwice(r.devices) {
		problems = append(problems, fmt.Sprintf("device %s is listed more than once in pool %s (generation %d): the scheduler does not allocate from such a pool", d, r.pool, r.generation))
	}
	if len(r.devices) == 0 {
		problems = append(problems, "no devices for node "+r.node+" in pool "+r.pool)
	}
	if len(problems) > 0 {
		r.set(verify.CheckDRASlices, verify.Fail, "%s", strings.Join(problems, "; "))
	} else {
		r.set(verify.CheckDRASlices, verify.Pass, "%d slice(s) for the node by %s, %d pool(s), %d device(s) in pool %s (generation %d)", len(sl), strings.Join(how, ", "), len(pools), len(r.devices), r.pool, r.generation)
	}
	r.devices = slices.Compact(r.devices)
	// The checks hold several devices at once, as the scheduler could
	// give them: of partitions of one device, only those that fit it
	// together.
	r.published = r.devices
	r.devices = fitTogether(newestPools(sl)[r.pool], r.devices)
	if len(r.devices) == 0 {
		return r.stop("no devices: see " + verify.CheckDRASlices)
	}
	return true
}

// elsewhere says which of the driver's slices are for other nodes, when
// it has some: a node selector that does not match is the usual cause.
func (r *run) elsewhere(ctx context.Context) string {
	l, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorDriver + "=" + r.driver, Limit: 5})
	if err != nil || len(l.Items) == 0 {
		return ""
	}
	var names []string
	for _, s := range l.Items {
		names = append(names, s.Name+" ("+nodeSelection(&s)+")")
	}
	return fmt.Sprintf("; the driver's slices %s select other nodes than Node %s (name %s, labels %v)", strings.Join(names, ", "), r.node, r.node, r.nodeObject(ctx).Labels)
}

// newestGeneration is the newest generation of pool among sl.
func newestGeneration(sl []resourcev1.ResourceSlice, pool string) int64 {
	gen := int64(-1)
	for _, s := range sl {
		if s.Spec.Pool.Name == pool {
			gen = max(gen, s.Spec.Pool.Generation)
		}
	}
	return gen
}

// deviceNames lists, sorted, the devices of the newest generation of
// pool that are offered to node; a name listed twice is there twice.
func deviceNames(sl []resourcev1.ResourceSlice, pool string, node *corev1.Node) []string {
	var out []string
	gen := newestGeneration(sl, pool)
	for i := range sl {
		s := &sl[i]
		if s.Spec.Pool.Name != pool || s.Spec.Pool.Generation != gen {
			continue
		}
		for j := range s.Spec.Devices {
			if deviceForNode(s, &s.Spec.Devices[j], node) {
				out = append(out, s.Spec.Devices[j].Name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// listedTwice lists the names that sorted lists more than once.
func listedTwice(sorted []string) []string {
	var out []string
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] && !slices.Contains(out, sorted[i]) {
			out = append(out, sorted[i])
		}
	}
	return out
}
