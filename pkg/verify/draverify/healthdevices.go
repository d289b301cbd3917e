package draverify

import (
	"context"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

// The kubelet maps a health report to pods by the pool and device names
// of the devices their claims were prepared with
// (pkg/kubelet/cm/dra/manager.go HandleWatchResourcesStream): a device
// reported under names the driver does not publish matches no claim, and
// the report is dropped without a word.

// publishedKeys lists pool/device of every device sl (newest generation
// of each pool) offers to node.
func publishedKeys(sl []resourcev1.ResourceSlice, node *corev1.Node) map[string]bool {
	out := map[string]bool{}
	for pool := range newestPools(sl) {
		for _, d := range deviceNames(sl, pool, node) {
			out[pool+"/"+d] = true
		}
	}
	return out
}

// unpublished lists the reported pool/device keys that published lacks.
func unpublished(reported []string, published map[string]bool) []string {
	var out []string
	for _, k := range reported {
		if !published[k] {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// checkHealthDevices judges dra.health.published-devices on what the
// health checks' stream reported (healthWatch.seen).
func (r *run) checkHealthDevices(ctx context.Context) bool {
	id := verify.CheckDRAHealthDevices
	h := r.lastHealth
	if h == nil {
		r.set(id, verify.Skip, "no health stream was read: see %s", verify.CheckDRAHealth)
		return true
	}
	h.mu.Lock()
	reported := make([]string, 0, len(h.seen))
	for k := range h.seen {
		reported = append(reported, k)
	}
	h.mu.Unlock()
	sort.Strings(reported)
	if len(reported) == 0 {
		r.set(id, verify.Skip, "the health stream reported no device: see %s", verify.CheckDRAHealth)
		return true
	}
	sl, err := r.slicesNow(ctx)
	if err != nil {
		r.set(id, verify.Skip, "listing the ResourceSlices: %v", err)
		return true
	}
	// Published at the start of the run or now: a claim may hold a
	// device whose slice is gone since (dra.slices.republished judges
	// that), and the kubelet matches its reports.
	published := publishedKeys(sl, r.nodeObject(ctx))
	for _, d := range r.devices {
		published[r.pool+"/"+d] = true
	}
	unknown := unpublished(reported, published)
	switch {
	case len(unknown) > 0 && r.results[verify.CheckDRAHealth].Verdict == verify.Fail:
		// One cause, one failure: a driver that reports its devices
		// under other names fails dra.health for those it never reports.
		r.set(id, verify.Skip, "see %s; the stream also reported device(s) the driver does not publish for the node: %s", verify.CheckDRAHealth, strings.Join(unknown, ", "))
	case len(unknown) > 0:
		r.set(id, verify.Fail, "the health stream reported device(s) the driver did not publish for node %s during the run (pool/device): %s; the kubelet matches a report to no claim then and drops it", r.node, strings.Join(unknown, ", "))
	default:
		r.set(id, verify.Pass, "the %d device(s) the stream reported are all published for the node: %s", len(reported), strings.Join(reported, ", "))
	}
	return true
}
