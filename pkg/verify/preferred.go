package verify

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The checks of GetPreferredAllocation (preferred.*).

// preferredQuery is one GetPreferredAllocation question: choose size of
// available, including must.
type preferredQuery struct {
	available []string
	must      string
	size      int
}

func (q preferredQuery) String() string {
	return fmt.Sprintf("size %d of %d available, mustInclude [%q]", q.size, len(q.available), q.must)
}

// preferredQueries returns the questions verify asks for a set of healthy
// devices. They depend only on the set, never on the order the plugin
// lists its devices in: the available IDs are sorted, and mustInclude is
// asked in turn for the last, the first and the middle one, so that a
// plugin that ignores mustInclude and takes devices from either end of the
// list, or in an order of its own, misses one of them in every run, not in
// some. The size leaves at least one available device out, so the answer
// has to choose.
func preferredQueries(healthy []string) []preferredQuery {
	ids := slices.Compact(slices.Sorted(slices.Values(healthy)))
	if len(ids) < 2 {
		return nil
	}
	size := min(3, len(ids)-1)
	var out []preferredQuery
	for _, i := range []int{len(ids) - 1, 0, len(ids) / 2} {
		if !slices.ContainsFunc(out, func(q preferredQuery) bool { return q.must == ids[i] }) {
			out = append(out, preferredQuery{available: ids, must: ids[i], size: size})
		}
	}
	return out
}

// preferredAnswer is the plugin's answer to a preferredQuery.
type preferredAnswer struct {
	q   preferredQuery
	ids []string
	err error
}

// judge returns what is wrong with the answer for each of the three
// preferred.* checks ("" when nothing is).
func (a preferredAnswer) judge() (size, must, avail string) {
	q := a.q
	if len(a.ids) != q.size {
		size = fmt.Sprintf("asked %s, got %d IDs %q", q, len(a.ids), a.ids)
	}
	if !slices.Contains(a.ids, q.must) {
		must = fmt.Sprintf("asked %s, got %q without %q", q, a.ids, q.must)
	}
	var bad []string
	seen := map[string]bool{}
	for _, id := range a.ids {
		if !slices.Contains(q.available, id) {
			bad = append(bad, fmt.Sprintf("%q is not available", id))
		}
		if seen[id] {
			bad = append(bad, fmt.Sprintf("%q is returned twice", id))
		}
		seen[id] = true
	}
	if len(bad) > 0 {
		avail = fmt.Sprintf("asked %s: %s", q, strings.Join(bad, "; "))
	}
	return size, must, avail
}

// askPreferred asks every query of healthy in turn; it stops at the first
// call that fails.
func (r *runner) askPreferred(ctx context.Context, c *conn, healthy []string) []preferredAnswer {
	var out []preferredAnswer
	for _, q := range preferredQueries(healthy) {
		cctx, cancel := r.callCtx(ctx)
		resp, err := c.Client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: q.available, MustIncludeDeviceIDs: []string{q.must}, AllocationSize: int32(q.size),
			}},
		})
		cancel()
		a := preferredAnswer{q: q, err: err}
		switch {
		case err == nil && len(resp.ContainerResponses) != 1:
			a.err = fmt.Errorf("1 container request got %d responses", len(resp.ContainerResponses))
		case err == nil:
			a.ids = resp.ContainerResponses[0].DeviceIDs
		}
		out = append(out, a)
		if a.err != nil {
			break
		}
	}
	return out
}

// preferredAttempts bounds how often the preferred checks ask again when
// the healthy devices changed while they asked.
const preferredAttempts = 3

func (r *runner) checkPreferred(ctx context.Context) {
	size, must, avail := r.outcome(), r.outcome(), r.outcome()
	all := []*outcome{size, must, avail}
	for _, res := range r.resources {
		c := r.emu.current(res)
		st, ok := r.state(res)
		switch {
		case c == nil || !ok:
			for _, o := range all {
				o.skip(res, "no device list; see %s", CheckFirstMessage)
			}
			continue
		case !c.Options.GetPreferredAllocationAvailable:
			for _, o := range all {
				o.skip(res, "not offered (GetPreferredAllocationAvailable is false)")
			}
			continue
		case len(st.healthy) < 2:
			for _, o := range all {
				o.skip(res, "needs at least 2 healthy devices, has %d%s", len(st.healthy), r.viewNote(res))
			}
			continue
		}
		// The questions are built from the healthy devices as the kubelet
		// sees them. A device that changes health while they are asked can
		// make a correct plugin leave it out: ask again with the new set
		// rather than fail, so the verdict does not depend on that race.
		var answers []preferredAnswer
		for attempt := 1; ; attempt++ {
			answers = r.askPreferred(ctx, c, st.healthy)
			if len(answers) > 0 && status.Code(answers[0].err) == codes.Unimplemented {
				break
			}
			bad := false
			for _, a := range answers {
				s, m, v := a.judge()
				bad = bad || a.err != nil || s != "" || m != "" || v != ""
			}
			if !bad || attempt == preferredAttempts {
				break
			}
			var now []string
			changed := r.emu.waitFor(ctx, r.cfg.QuietPeriod, func() bool {
				now = healthyNow(c)
				return !sameSet(now, st.healthy)
			})
			if !changed || len(now) < 2 {
				break
			}
			st.healthy = now
		}
		if len(answers) > 0 && status.Code(answers[0].err) == codes.Unimplemented {
			for _, o := range all {
				o.skip(res, "answers Unimplemented; see %s", CheckOptions)
			}
			continue
		}
		var sizeBad, mustBad, availBad, asked []string
		failed := false
		for _, a := range answers {
			if a.err != nil {
				size.fail(res, "GetPreferredAllocation(%s) failed: %s", a.q, statusMessage(a.err))
				must.skip(res, "the call failed; see %s", CheckPrefSize)
				avail.skip(res, "the call failed; see %s", CheckPrefSize)
				failed = true
				break
			}
			s, m, v := a.judge()
			sizeBad, mustBad, availBad = appendNonEmpty(sizeBad, s), appendNonEmpty(mustBad, m), appendNonEmpty(availBad, v)
			asked = append(asked, fmt.Sprintf("%q", a.q.must))
		}
		if failed {
			continue
		}
		q := answers[0].q
		conclude := func(o *outcome, bad []string, ok string) {
			if len(bad) > 0 {
				o.fail(res, "%s", strings.Join(bad, "; "))
			} else {
				o.pass(res, "%s", ok)
			}
		}
		conclude(size, sizeBad, fmt.Sprintf("%d IDs every time (asked %d of %d, %d times)", q.size, q.size, len(q.available), len(answers)))
		conclude(must, mustBad, fmt.Sprintf("mustInclude %s each included", strings.Join(asked, ", ")))
		conclude(avail, availBad, "every ID is available, none twice")
	}
	r.conclude(CheckPrefSize, size)
	r.conclude(CheckPrefMust, must)
	r.conclude(CheckPrefAvailable, avail)
}
