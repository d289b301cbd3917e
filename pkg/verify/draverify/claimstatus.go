package draverify

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/pkg/verify"
)

// A claim's status.devices (KEP-4817) is the driver's to write: an entry
// per device it set up, with conditions, data and networkData. The API
// server refuses an entry it finds invalid (validateDeviceStatus) and
// one the writer may not write for the driver
// (AuthorizedForDeviceStatus); such a write fails as a whole with 422
// Invalid, and the claim stays without the driver's status. verify's
// proxy to the API server notes those refusals.

// statusRefusals are the driver's writes of a ResourceClaim's status
// that the API server refused as invalid.
type statusRefusals struct {
	mu    sync.Mutex
	count int
	msgs  []string // distinct, the first few
}

const maxRefusals = 3

// noteRefused notes a response that refuses the driver a write of a
// ResourceClaim's status as invalid (422), and leaves the body for the
// driver.
func (p *apiProxy) noteRefused(resp *http.Response) {
	if resp.StatusCode != http.StatusUnprocessableEntity {
		return
	}
	in := resp.Request.Clone(resp.Request.Context())
	in.URL.Path = strings.TrimPrefix(in.URL.Path, p.prefix)
	info, err := requestInfo.NewRequestInfo(in)
	if err != nil || !info.IsResourceRequest || info.APIGroup != resourcev1.GroupName || info.Resource != "resourceclaims" || info.Subresource != "status" {
		return
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
	if err != nil {
		return
	}
	msg := fmt.Sprintf("%s of ResourceClaim %s/%s: %s", info.Verb, info.Namespace, info.Name, statusMessage(body))
	rf := &p.refused
	rf.mu.Lock()
	defer rf.mu.Unlock()
	rf.count++
	for _, m := range rf.msgs {
		if m == msg {
			return
		}
	}
	if len(rf.msgs) < maxRefusals {
		rf.msgs = append(rf.msgs, msg)
	}
	p.log.Debug("The API server refused the driver a write of a claim's status", "message", msg)
}

// refusedWrites returns how many writes of claims' status the API server
// refused the driver and the first few of its messages.
func (p *apiProxy) refusedWrites() (int, []string) {
	p.refused.mu.Lock()
	defer p.refused.mu.Unlock()
	return p.refused.count, append([]string(nil), p.refused.msgs...)
}

// statusProblems lists what is wrong with the driver's entries in a
// claim's status.devices: an entry not for one of the driver's results
// of the allocation (the API server refuses it too), and a networkData
// hardwareAddress that is no hardware address (which it does not). n
// counts the driver's entries.
func statusProblems(c *resourcev1.ResourceClaim, driver string) (problems []string, n int) {
	type key struct{ driver, pool, device, share string }
	allocated := map[key]bool{}
	if a := c.Status.Allocation; a != nil {
		for _, res := range a.Devices.Results {
			allocated[key{res.Driver, res.Pool, res.Device, string(ptr.Deref(res.ShareID, ""))}] = true
		}
	}
	for _, e := range c.Status.Devices {
		if e.Driver != driver {
			continue // another driver's to write
		}
		n++
		name := e.Pool + "/" + e.Device
		if e.ShareID != nil {
			name += " (share " + *e.ShareID + ")"
		}
		if !allocated[key{e.Driver, e.Pool, e.Device, ptr.Deref(e.ShareID, "")}] {
			problems = append(problems, fmt.Sprintf("claim %s: the driver's entry of device %s is for no result of the claim's allocation", c.Name, name))
		}
		if nd := e.NetworkData; nd != nil && nd.HardwareAddress != "" {
			if _, err := net.ParseMAC(nd.HardwareAddress); err != nil {
				problems = append(problems, fmt.Sprintf("claim %s: the entry of device %s has networkData.hardwareAddress %q, not a hardware address: %v", c.Name, name, nd.HardwareAddress, err))
			}
		}
	}
	return problems, n
}

// checkClaimStatus judges dra.claim.status-devices on claim-a and
// claim-b and on others, prepared by the checks before it: the entries
// the driver wrote after Prepare, and the writes the API server refused.
func (r *run) checkClaimStatus(ctx context.Context, others []*resourcev1.ResourceClaim) {
	id := verify.CheckDRAClaimStatus
	var claims []*resourcev1.ResourceClaim
	for _, role := range []string{"claim-a", "claim-b"} {
		if c := r.claims[role]; c != nil && r.prepared[string(c.UID)] != nil {
			claims = append(claims, c)
		}
	}
	claims = append(claims, others...)
	var problems, read []string
	entries := 0
	for _, c := range claims {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		cur, err := r.client.ResourceV1().ResourceClaims(c.Namespace).Get(cctx, c.Name, metav1.GetOptions{})
		cancel()
		if err != nil {
			r.set(id, verify.Skip, "reading claim %s: %v", c.Name, err)
			return
		}
		pr, n := statusProblems(cur, r.driver)
		problems = append(problems, pr...)
		entries += n
		read = append(read, c.Name)
	}
	refused, msgs := 0, []string(nil)
	if r.sb != nil && r.sb.proxy != nil {
		refused, msgs = r.sb.proxy.refusedWrites()
	}
	if refused > 0 {
		problems = append([]string{fmt.Sprintf("the API server refused %d write(s) of the driver to claims' status, and the claims stay without what it wrote: %s", refused, strings.Join(msgs, "; "))}, problems...)
	}
	switch {
	case len(problems) > 0:
		r.set(id, verify.Fail, "%s", strings.Join(problems, "; "))
	case entries == 0:
		r.set(id, verify.Skip, "the driver wrote no status.devices in %s after preparing them: writing them is optional (KEP-4817)", strings.Join(read, ", "))
	default:
		r.set(id, verify.Pass, "%d status.devices entr(ies) in %s, each for one of the driver's results of the claim's allocation; no write refused", entries, strings.Join(read, ", "))
	}
}
