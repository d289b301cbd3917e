package verify

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/pkg/resourcename"
)

// kubeletMaxMessage is the kubelet's gRPC receive limit (the default).
const kubeletMaxMessage = 4 << 20

func resourceNameProblems(name string) []string { return resourcename.Problems(name) }

// statusMessage shortens a gRPC error to its code and message.
func statusMessage(err error) string {
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// deviceState is what the latest ListAndWatch message of a resource says.
type deviceState struct {
	healthy, unhealthy []string
}

func stateOf(devs []*pluginapi.Device) deviceState {
	var s deviceState
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			s.healthy = append(s.healthy, d.ID)
		} else {
			s.unhealthy = append(s.unhealthy, d.ID)
		}
	}
	return s
}

// state returns the devices the kubelet's stream of res last reported.
func (r *runner) state(res string) (deviceState, bool) {
	c := r.emu.current(res)
	if c == nil {
		return deviceState{}, false
	}
	msgs, _, _ := r.emu.messages(c)
	if len(msgs) == 0 {
		return deviceState{}, false
	}
	return stateOf(msgs[len(msgs)-1].Devices), true
}

// viewNote explains, for a check skipped for lack of (healthy) devices,
// that the kubelet's view may lack them because the plugin sent a partial
// list; "" otherwise.
func (r *runner) viewNote(res string) string {
	c := r.emu.current(res)
	if c == nil {
		return ""
	}
	msgs, _, _ := r.emu.messages(c)
	if leftOutAny(msgs) {
		return fmt.Sprintf(" as the kubelet sees it: a ListAndWatch message left devices out (see %s and %s)", CheckFullList, CheckVanished)
	}
	return ""
}

// leftOutAny reports whether a message of msgs left out a device that the
// message before it listed.
func leftOutAny(msgs []message) bool {
	for i := 1; i < len(msgs); i++ {
		if len(leftOut(msgs[i-1].Devices, msgs[i].Devices)) > 0 {
			return true
		}
	}
	return false
}

// leftOut returns the IDs in prev that next does not list.
func leftOut(prev, next []*pluginapi.Device) []string {
	now := make(map[string]bool, len(next))
	for _, d := range next {
		if d != nil {
			now[d.ID] = true
		}
	}
	var out []string
	for _, d := range prev {
		if d != nil && !now[d.ID] {
			out = append(out, d.ID)
		}
	}
	return out
}

func (r *runner) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.CallTimeout)
}

// openWatchers opens the verifier's own ListAndWatch stream to every
// resource, on its own connection, kept open for the whole run.
func (r *runner) openWatchers(ctx context.Context) {
	r.watchers = map[string]*conn{}
	for _, res := range r.resources {
		kc := r.emu.current(res)
		if kc == nil {
			continue
		}
		cc, err := dialPlugin(kc.Socket)
		if err != nil {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		c := &conn{Resource: res, Socket: kc.Socket, Client: pluginapi.NewDevicePluginClient(cc), cc: cc, cancel: cancel}
		go func() { <-ctx.Done(); _ = cc.Close() }()
		go r.emu.watch(sctx, c)
		r.watchers[res] = c
	}
}

func (r *runner) checkFirstMessage(ctx context.Context) {
	o := r.outcome()
	for _, res := range r.resources {
		c := r.emu.current(res)
		if c == nil {
			o.skip(res, "not registered any more")
			continue
		}
		var first *message
		r.emu.waitFor(ctx, r.cfg.CallTimeout, func() bool {
			if len(c.msgs) > 0 {
				m := c.msgs[0]
				first = &m
				return true
			}
			return c.ended
		})
		if first == nil {
			_, ended, err := r.emu.messages(c)
			if ended {
				o.fail(res, "ListAndWatch ended without a message: %v", err)
			} else {
				o.fail(res, "no ListAndWatch message within %s", r.cfg.CallTimeout)
			}
			continue
		}
		if problems := deviceListProblems(first.Devices); len(problems) > 0 {
			o.fail(res, "first message: %s", strings.Join(problems, "; "))
			continue
		}
		if len(first.Devices) == 0 {
			o.warn(res, "the first message lists no devices: the node advertises 0 %s%s", res, r.sdkRefusal())
			continue
		}
		s := stateOf(first.Devices)
		o.pass(res, "%d devices (%d healthy) %s after registration", len(first.Devices), len(s.healthy), first.At.Sub(r.registeredAt(res)).Round(time.Millisecond))
	}
	r.conclude(CheckFirstMessage, o)
}

// sdkRefusedLog starts the message of the error the dpkit SDK logs when it
// refuses a device list (pkg/deviceplugin, logDevicesRefused).
const sdkRefusedLog = "Device list refused"

// sdkRefusal returns, for a plugin built on the SDK, the last line of its
// output in which the SDK says it refused a device list, as a note for a
// detail; "" when there is none.
func (r *runner) sdkRefusal() string {
	if r.proc == nil || !r.sdk() {
		return ""
	}
	lines := strings.Split(r.proc.Output(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], sdkRefusedLog) {
			line := strings.TrimSpace(lines[i])
			if len(line) > 1000 {
				line = line[:1000] + "..."
			}
			return "; the plugin's output has the SDK's refusal of its list: " + line
		}
	}
	return ""
}

// registeredAt returns the time of the latest accepted registration of res.
func (r *runner) registeredAt(res string) time.Time {
	var at time.Time
	for _, reg := range r.emu.registrations() {
		if reg.Resource == res && reg.Err == nil {
			at = reg.At
		}
	}
	return at
}

// deviceListProblems checks a ListAndWatch device list as the kubelet
// would use it.
func deviceListProblems(devs []*pluginapi.Device) []string {
	var out []string
	seen := map[string]bool{}
	for i, d := range devs {
		switch {
		case d == nil:
			out = append(out, fmt.Sprintf("devices[%d] is null", i))
			continue
		case d.ID == "":
			out = append(out, fmt.Sprintf("devices[%d] has an empty ID", i))
		case seen[d.ID]:
			out = append(out, fmt.Sprintf("device %q is listed twice", d.ID))
		}
		seen[d.ID] = true
		if d.Health != pluginapi.Healthy && d.Health != pluginapi.Unhealthy {
			out = append(out, fmt.Sprintf("device %q has health %q; use %q or %q", d.ID, d.Health, pluginapi.Healthy, pluginapi.Unhealthy))
		}
		if d.Topology != nil {
			for _, n := range d.Topology.Nodes {
				if n == nil || n.ID < 0 {
					out = append(out, fmt.Sprintf("device %q has an invalid NUMA node", d.ID))
				}
			}
		}
		if len(out) >= 5 {
			out = append(out, "...")
			break
		}
	}
	return out
}

// checkStreams opens several ListAndWatch streams at once and checks that
// each gets the device list, and that the kubelet's stream survives them.
func (r *runner) checkStreams(ctx context.Context) {
	const n = 3
	o := r.outcome()
	for _, res := range r.resources {
		kc := r.emu.current(res)
		want, ok := r.state(res)
		if kc == nil || !ok {
			o.skip(res, "the kubelet's stream has no device list; see %s", CheckFirstMessage)
			continue
		}
		wantIDs := append(append([]string(nil), want.healthy...), want.unhealthy...)
		sort.Strings(wantIDs)
		// When the kubelet's stream has a message that left devices out,
		// new streams list more than it: that is listandwatch.full-list's
		// failure, not this check's.
		kmsgs, _, _ := r.emu.messages(kc)
		partial := leftOutAny(kmsgs)
		var notes []string
		errs := make([]string, n)
		var wg sync.WaitGroup
		sctx, cancel := r.callCtx(ctx)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cc, err := dialPlugin(kc.Socket)
				if err != nil {
					errs[i] = err.Error()
					return
				}
				defer cc.Close()
				stream, err := pluginapi.NewDevicePluginClient(cc).ListAndWatch(sctx, &pluginapi.Empty{})
				if err != nil {
					errs[i] = statusMessage(err)
					return
				}
				resp, err := stream.Recv()
				if err != nil {
					if sctx.Err() != nil {
						errs[i] = fmt.Sprintf("stream %d got no message within %s", i+2, r.cfg.CallTimeout)
					} else {
						errs[i] = fmt.Sprintf("stream %d: %s", i+2, statusMessage(err))
					}
					return
				}
				var ids []string
				for _, d := range resp.Devices {
					ids = append(ids, d.ID)
				}
				sort.Strings(ids)
				if !slices.Equal(ids, wantIDs) && !partial {
					errs[i] = fmt.Sprintf("stream %d got %d devices, the first stream %d", i+2, len(ids), len(wantIDs))
				}
			}()
		}
		wg.Wait()
		cancel()
		var problems []string
		for _, e := range errs {
			if e != "" {
				problems = append(problems, e)
			}
		}
		if _, ended, err := r.emu.messages(kc); ended {
			problems = append(problems, fmt.Sprintf("the kubelet's stream ended when others opened: %v", err))
		}
		if partial {
			notes = append(notes, fmt.Sprintf(" (the kubelet's stream lists %d after a message that left devices out; see %s)", len(wantIDs), CheckFullList))
		}
		if len(problems) > 0 {
			o.fail(res, "%s", strings.Join(dedupe(problems), "; "))
		} else {
			o.pass(res, "%d more streams each got their device list; the first stayed open%s", n, strings.Join(notes, ""))
		}
	}
	r.conclude(CheckStreams, o)
}

// checkOptions compares the registered options with GetDevicePluginOptions
// and with the RPCs the plugin implements.
func (r *runner) checkOptions(ctx context.Context) {
	o := r.outcome()
	regs := r.emu.registrations()
	for _, res := range r.resources {
		c := r.emu.current(res)
		if c == nil {
			o.skip(res, "not registered any more")
			continue
		}
		opts := c.Options
		var problems, notes []string
		for _, reg := range regs {
			if reg.Resource == res && reg.Err == nil && reg.Options != nil &&
				(reg.Options.PreStartRequired != opts.PreStartRequired || reg.Options.GetPreferredAllocationAvailable != opts.GetPreferredAllocationAvailable) {
				notes = append(notes, fmt.Sprintf("Register claimed preStartRequired=%t getPreferredAllocationAvailable=%t but GetDevicePluginOptions answers %t/%t (the kubelet uses the latter)",
					reg.Options.PreStartRequired, reg.Options.GetPreferredAllocationAvailable, opts.PreStartRequired, opts.GetPreferredAllocationAvailable))
				break
			}
		}
		st, _ := r.state(res)
		if opts.GetPreferredAllocationAvailable {
			if err := r.preferredProbe(ctx, c, st); status.Code(err) == codes.Unimplemented {
				problems = append(problems, "claims GetPreferredAllocationAvailable but GetPreferredAllocation answers Unimplemented")
			}
		}
		if opts.PreStartRequired {
			ids := st.healthy
			if len(ids) > 1 {
				ids = ids[:1]
			}
			cctx, cancel := r.callCtx(ctx)
			_, err := c.Client.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids})
			cancel()
			if status.Code(err) == codes.Unimplemented {
				problems = append(problems, "claims PreStartRequired but PreStartContainer answers Unimplemented")
			}
		}
		switch {
		case len(problems) > 0:
			o.fail(res, "%s", strings.Join(problems, "; "))
		case len(notes) > 0:
			o.warn(res, "%s", strings.Join(notes, "; "))
		default:
			o.pass(res, "preStartRequired=%t getPreferredAllocationAvailable=%t", opts.PreStartRequired, opts.GetPreferredAllocationAvailable)
		}
	}
	r.conclude(CheckOptions, o)
}

// preferredProbe calls GetPreferredAllocation with a simple valid request.
func (r *runner) preferredProbe(ctx context.Context, c *conn, st deviceState) error {
	avail := st.healthy
	if len(avail) == 0 {
		avail = []string{"none"}
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	_, err := c.Client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: avail, AllocationSize: 1}},
	})
	return err
}

// unknownID returns a device ID that st does not have.
func unknownID(st deviceState) string {
	id := "dpkit-verify-unknown-device"
	for slices.Contains(st.healthy, id) || slices.Contains(st.unhealthy, id) {
		id += "-x"
	}
	return id
}

func (r *runner) allocate(ctx context.Context, c *conn, containers ...[]string) (*pluginapi.AllocateResponse, error) {
	req := &pluginapi.AllocateRequest{}
	for _, ids := range containers {
		req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	return c.Client.Allocate(cctx, req)
}

// checkAllocate decides the allocate.* checks. allocate.every-device comes
// first: the other checks then allocate only devices that succeeded alone,
// so that a device whose Allocate fails is one failure, of that check.
func (r *runner) checkAllocate(ctx context.Context) {
	resp, unknown, unhealthy, conc, every := r.outcome(), r.outcome(), r.outcome(), r.outcome(), r.outcome()
	defer r.conclude(CheckEveryDevice, every)
	for _, res := range r.resources {
		c := r.emu.current(res)
		st, ok := r.state(res)
		if c == nil || !ok {
			for _, o := range []*outcome{resp, unknown, unhealthy, conc, every} {
				o.skip(res, "no device list; see %s", CheckFirstMessage)
			}
			continue
		}
		failedAlone := r.everyDevice(ctx, every, res, c, st.healthy)
		// The devices as the kubelet sees them now, but those that failed
		// alone.
		st, _ = r.state(res)
		st.healthy = slices.DeleteFunc(st.healthy, func(id string) bool { return failedAlone[id] })
		// One response per container request.
		switch n := len(st.healthy); {
		case n == 0 && len(failedAlone) > 0:
			resp.skip(res, "every healthy device failed Allocate alone; see %s", CheckEveryDevice)
		case n == 0:
			resp.skip(res, "no healthy device to allocate%s", r.viewNote(res))
		default:
			containers := [][]string{{st.healthy[0]}}
			if n > 1 {
				containers = append(containers, []string{st.healthy[1]})
			}
			out, err := r.allocate(ctx, c, containers...)
			switch {
			case err != nil:
				resp.fail(res, "Allocate of healthy device(s) %v failed: %s", containers, statusMessage(err))
			case len(out.ContainerResponses) != len(containers):
				resp.fail(res, "%d container requests got %d responses; the kubelet fails the pod", len(containers), len(out.ContainerResponses))
			default:
				resp.pass(res, "%d container requests, %d responses", len(containers), len(out.ContainerResponses))
			}
		}
		// Unknown device.
		id := unknownID(st)
		if _, err := r.allocate(ctx, c, []string{id}); err == nil {
			unknown.fail(res, "Allocate of unknown device %q succeeded", id)
		} else {
			unknown.pass(res, "refused: %s", statusMessage(err))
		}
		// Unhealthy device.
		if len(st.unhealthy) == 0 {
			unhealthy.skip(res, "no device is unhealthy")
		} else if _, err := r.allocate(ctx, c, []string{st.unhealthy[0]}); err == nil {
			unhealthy.fail(res, "Allocate of unhealthy device %q succeeded", st.unhealthy[0])
		} else {
			unhealthy.pass(res, "%q refused: %s", st.unhealthy[0], statusMessage(err))
		}
		// Concurrent calls.
		switch {
		case len(st.healthy) == 0 && len(failedAlone) > 0:
			conc.skip(res, "every healthy device failed Allocate alone; see %s", CheckEveryDevice)
			continue
		case len(st.healthy) == 0:
			conc.skip(res, "no healthy device to allocate%s", r.viewNote(res))
			continue
		}
		const calls = 8
		errs := make([]error, calls)
		var wg sync.WaitGroup
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// The first two healthy devices: a device that changes
				// health meanwhile must not make the check flaky.
				out, err := r.allocate(ctx, c, []string{st.healthy[i%min(2, len(st.healthy))]})
				if err == nil && len(out.ContainerResponses) != 1 {
					err = fmt.Errorf("%d responses for 1 container", len(out.ContainerResponses))
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		var failed []string
		for _, err := range errs {
			if err != nil {
				failed = append(failed, statusMessage(err))
			}
		}
		if len(failed) > 0 {
			conc.fail(res, "%d of %d concurrent calls failed: %s", len(failed), calls, strings.Join(dedupe(failed), "; "))
		} else {
			conc.pass(res, "%d concurrent calls succeeded", calls)
		}
	}
	r.conclude(CheckResponses, resp)
	r.conclude(CheckUnknown, unknown)
	r.conclude(CheckUnhealthy, unhealthy)
	r.conclude(CheckConcurrent, conc)
}

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

// healthyNow returns the healthy devices c's stream last reported. The
// emulator's lock must be held.
func healthyNow(c *conn) []string {
	if len(c.msgs) == 0 {
		return nil
	}
	return stateOf(c.msgs[len(c.msgs)-1].Devices).healthy
}

func sameSet(a, b []string) bool {
	return slices.Equal(slices.Sorted(slices.Values(a)), slices.Sorted(slices.Values(b)))
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

func appendNonEmpty(list []string, s string) []string {
	if s == "" {
		return list
	}
	return append(list, s)
}

func (r *runner) checkPreStart(ctx context.Context) {
	o := r.outcome()
	for _, res := range r.resources {
		c := r.emu.current(res)
		st, ok := r.state(res)
		switch {
		case c == nil || !ok:
			o.skip(res, "no device list; see %s", CheckFirstMessage)
			continue
		case !c.Options.PreStartRequired:
			o.skip(res, "not required (PreStartRequired is false)")
			continue
		case len(st.healthy) == 0:
			o.skip(res, "no healthy device%s", r.viewNote(res))
			continue
		}
		cctx, cancel := r.callCtx(ctx)
		_, err := c.Client.PreStartContainer(cctx, &pluginapi.PreStartContainerRequest{DevicesIds: st.healthy[:1]})
		cancel()
		switch {
		case status.Code(err) == codes.Unimplemented:
			o.skip(res, "answers Unimplemented; see %s", CheckOptions)
		case err != nil:
			o.fail(res, "PreStartContainer(%v) failed: %s", st.healthy[:1], statusMessage(err))
		default:
			o.pass(res, "PreStartContainer(%v) succeeded", st.healthy[:1])
		}
	}
	r.conclude(CheckPreStart, o)
}

// healthOf maps device IDs to health.
func healthOf(devs []*pluginapi.Device) map[string]string {
	out := make(map[string]string, len(devs))
	for _, d := range devs {
		out[d.ID] = d.Health
	}
	return out
}

// healthChange returns the first health change between consecutive
// messages, or "".
func healthChange(msgs []message) string {
	for i := 1; i < len(msgs); i++ {
		prev := healthOf(msgs[i-1].Devices)
		for _, d := range msgs[i].Devices {
			if h, ok := prev[d.ID]; ok && h != d.Health {
				return fmt.Sprintf("%s %s -> %s", d.ID, h, d.Health)
			}
		}
	}
	return ""
}

// sameHealth reports whether a and b give the same health to every device
// both list, and list one at least. Devices only one of them lists are
// listandwatch.full-list's concern, not the health check's.
func sameHealth(a, b []*pluginapi.Device) bool {
	ha, hb := healthOf(a), healthOf(b)
	common := 0
	for id, h := range ha {
		if g, ok := hb[id]; ok {
			if g != h {
				return false
			}
			common++
		}
	}
	return common > 0
}

// checkHealth observes health changes on the kubelet's stream and the
// verifier's own and checks that both end up with the same health.
func (r *runner) checkHealth(ctx context.Context) {
	o := r.outcome()
	for _, res := range r.resources {
		kc, wc := r.emu.current(res), r.watchers[res]
		if kc == nil || wc == nil {
			o.skip(res, "no streams to observe")
			continue
		}
		var change string
		r.emu.waitFor(ctx, r.cfg.HealthWait, func() bool {
			if change = healthChange(kc.msgs); change == "" {
				change = healthChange(wc.msgs)
			}
			return change != ""
		})
		if change == "" {
			o.skip(res, "no device changed health during the run; observe one with --health-wait")
			continue
		}
		var kLast, wLast []*pluginapi.Device
		agreed := r.emu.waitFor(ctx, r.cfg.CallTimeout, func() bool {
			if len(kc.msgs) == 0 || len(wc.msgs) == 0 {
				return false
			}
			kLast, wLast = kc.msgs[len(kc.msgs)-1].Devices, wc.msgs[len(wc.msgs)-1].Devices
			return sameHealth(kLast, wLast)
		})
		if agreed {
			o.pass(res, "%s reached both open streams", change)
			continue
		}
		kc2, wc2 := healthChange(kc.msgs) != "", healthChange(wc.msgs) != ""
		switch {
		case len(wLast) == 0:
			o.skip(res, "%s on the kubelet's stream; a second open stream got no message (see %s)", change, CheckStreams)
		case kc2 && !wc2:
			o.fail(res, "%s reached the kubelet's stream but not a second open stream", change)
		case wc2 && !kc2:
			o.fail(res, "%s reached a second open stream but not the kubelet's", change)
		default:
			o.fail(res, "after %s the two open streams disagree on device health", change)
		}
	}
	r.conclude(CheckHealth, o)
}

// streamLog is what one ListAndWatch stream received, named for details.
type streamLog struct {
	name string
	msgs []message
}

// streams returns every ListAndWatch stream of res verify kept open: the
// emulated kubelet's, one per accepted registration, and verify's own.
func (r *runner) streams(res string) []streamLog {
	var conns []*conn
	r.emu.mu.Lock()
	for _, c := range r.emu.history {
		if c.Resource == res {
			conns = append(conns, c)
		}
	}
	r.emu.mu.Unlock()
	var out []streamLog
	for i, c := range conns {
		msgs, _, _ := r.emu.messages(c)
		name := "the kubelet's stream"
		if len(conns) > 1 {
			name = fmt.Sprintf("the kubelet's stream %d of %d (%s)", i+1, len(conns), filepath.Base(c.Socket))
		}
		out = append(out, streamLog{name: name, msgs: msgs})
	}
	if wc := r.watchers[res]; wc != nil {
		msgs, _, _ := r.emu.messages(wc)
		out = append(out, streamLog{name: "verify's second stream", msgs: msgs})
	}
	return out
}

// checkMessages decides the checks that look at every ListAndWatch message
// received during the run.
func (r *runner) checkMessages(ctx context.Context) {
	size, full, vanished, ids := r.outcome(), r.outcome(), r.outcome(), r.outcome()
	for _, res := range r.resources {
		streams := r.streams(res)
		r.judgeMessageSize(size, res, streams)
		if r.judgeFullList(ctx, full, res, streams) {
			vanished.skip(res, "updates left out devices that were not removed; see %s", CheckFullList)
		} else {
			r.judgeVanished(vanished, res, streams)
		}
		judgeDeviceIDs(ids, res, streams)
	}
	r.conclude(CheckMessageSize, size)
	r.conclude(CheckFullList, full)
	r.conclude(CheckVanished, vanished)
	r.conclude(CheckDeviceIDs, ids)
}

func (r *runner) judgeMessageSize(o *outcome, res string, streams []streamLog) {
	largest, count := 0, 0
	for _, s := range streams {
		for _, m := range s.msgs {
			count++
			largest = max(largest, m.Size)
		}
	}
	switch {
	case count == 0:
		o.skip(res, "no ListAndWatch message was received")
	case largest > kubeletMaxMessage:
		o.fail(res, "largest message %d bytes, over the kubelet's limit of %d: the kubelet drops the stream and sees no devices; split the devices over several resources or shorten their IDs", largest, kubeletMaxMessage)
	case largest > kubeletMaxMessage*3/4:
		o.warn(res, "largest message %d bytes, over 75%% of the kubelet's limit of %d", largest, kubeletMaxMessage)
	default:
		o.pass(res, "largest of %d messages: %d bytes (limit %d)", count, largest, kubeletMaxMessage)
	}
}

// partialUpdate is a ListAndWatch message that left out devices which the
// message before it on the same stream listed and which a stream opened
// after it still got: they were not removed, the plugin sent only part of
// its list, and the kubelet would have dropped them.
type partialUpdate struct {
	stream  string
	index   int // of the message on its stream, from 1
	at      time.Time
	listed  int
	leftOut []string
}

// findPartial returns the partial updates in streams, how many updates
// (messages after a stream's first) there were, and how many messages left
// devices out that no later stream confirmed. The first message of a
// stream is a full list by definition (listandwatch.first-message checks
// it), so a device a message leaves out but a stream opened afterwards
// lists was not removed. A device that is really removed and comes back
// within the run is reported too.
func findPartial(streams []streamLog) (partials []partialUpdate, updates, unconfirmed int) {
	var firsts []message
	for _, s := range streams {
		if len(s.msgs) > 0 {
			firsts = append(firsts, s.msgs[0])
		}
	}
	listedAfter := func(id string, t time.Time) bool {
		for _, f := range firsts {
			if f.At.After(t) && slices.ContainsFunc(f.Devices, func(d *pluginapi.Device) bool { return d != nil && d.ID == id }) {
				return true
			}
		}
		return false
	}
	for _, s := range streams {
		for i := 1; i < len(s.msgs); i++ {
			updates++
			m := s.msgs[i]
			left := leftOut(s.msgs[i-1].Devices, m.Devices)
			var still []string
			for _, id := range left {
				if listedAfter(id, m.At) {
					still = append(still, id)
				}
			}
			switch {
			case len(still) > 0:
				partials = append(partials, partialUpdate{stream: s.name, index: i + 1, at: m.At, listed: len(m.Devices), leftOut: still})
			case len(left) > 0:
				unconfirmed++
			}
		}
	}
	return partials, updates, unconfirmed
}

// judgeFullList checks that every update is a full list, and reports
// whether it failed. When a message left devices out that no later stream
// confirmed, a new stream is opened now: its first message tells whether
// they still exist.
func (r *runner) judgeFullList(ctx context.Context, o *outcome, res string, streams []streamLog) (failed bool) {
	partials, updates, unconfirmed := findPartial(streams)
	if len(partials) == 0 && unconfirmed > 0 {
		if m, ok := r.newStreamList(ctx, res); ok {
			streams = append(streams, streamLog{name: "a new stream", msgs: []message{m}})
			partials, updates, _ = findPartial(streams)
		}
	}
	switch {
	case len(partials) > 0:
		p := partials[0]
		o.fail(res, "%d of %d updates left out devices that were not removed; first: message %d of %s, at %s, listed %d devices and left out %d that the message before listed and a later stream still got (%s): the kubelet removes every device a message leaves out; send the full list in every message",
			len(partials), updates, p.index, p.stream, r.since(p.at), p.listed, len(p.leftOut), quoteSome(p.leftOut, 3))
		return true
	case updates == 0:
		o.skip(res, "no stream got a second message: nothing changed during the run; make a device change health and give --health-wait")
	default:
		o.pass(res, "%d updates on %d streams, each a full list", updates, len(streams))
	}
	return false
}

// vanishing is a ListAndWatch update that left out devices the message
// before it on the same stream listed.
type vanishing struct {
	stream      string
	index       int // of the message on its stream, from 1
	at          time.Time
	before, now int // devices listed by the message before and by this one
	gone        []string
	back        int // index of a later message of the stream that lists one of them again; 0 if none
}

// findVanished returns every update in streams that left out devices the
// message before it listed, and how many updates there were. Unlike
// findPartial it needs no later stream to confirm that the devices still
// exist: a plugin that sends part of its list, and also keeps only that
// part (as the SDK does with the list notify was last given), shows
// nothing else.
func findVanished(streams []streamLog) (out []vanishing, updates int) {
	for _, s := range streams {
		for i := 1; i < len(s.msgs); i++ {
			updates++
			gone := leftOut(s.msgs[i-1].Devices, s.msgs[i].Devices)
			if len(gone) == 0 {
				continue
			}
			v := vanishing{stream: s.name, index: i + 1, at: s.msgs[i].At, before: len(s.msgs[i-1].Devices), now: len(s.msgs[i].Devices), gone: gone}
			for j := i + 1; j < len(s.msgs) && v.back == 0; j++ {
				if len(leftOut(devicesWith(gone), s.msgs[j].Devices)) < len(gone) {
					v.back = j + 1
				}
			}
			out = append(out, v)
		}
	}
	return out, updates
}

// devicesWith returns devices with the given IDs.
func devicesWith(ids []string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		out[i] = &pluginapi.Device{ID: id}
	}
	return out
}

// judgeVanished warns when devices vanished from one update to the next
// on an open stream. verify cannot tell a device unplugged from one left
// out by mistake, so it only warns, and names the devices.
func (r *runner) judgeVanished(o *outcome, res string, streams []streamLog) {
	found, updates := findVanished(streams)
	switch {
	case updates == 0:
		o.skip(res, "no stream got a second message: nothing changed during the run; make a device change health and give --health-wait")
	case len(found) > 0:
		v := found[0]
		back := "no later message listed them again"
		if v.back > 0 {
			back = fmt.Sprintf("message %d listed some of them again", v.back)
		}
		more := ""
		if len(found) > 1 {
			more = fmt.Sprintf(" (%d such messages on the streams verify kept open)", len(found))
		}
		o.warn(res, "message %d of %s, at %s, listed %s where the message before listed %d, while the stream stayed open: %d vanished (%s) and %s%s. The kubelet removed them from the node's capacity: unless they were unplugged, the plugin sent only part of its list",
			v.index, v.stream, r.since(v.at), plural(v.now, "device"), v.before, len(v.gone), quoteSome(v.gone, 5), back, more)
	default:
		o.pass(res, "%d updates on %d streams; none left out a device the message before listed", updates, len(streams))
	}
}

// newStreamList opens a ListAndWatch stream to the plugin's current
// endpoint and returns its first message.
func (r *runner) newStreamList(ctx context.Context, res string) (message, bool) {
	c := r.emu.current(res)
	if c == nil {
		return message{}, false
	}
	cctx, cancel := r.callCtx(ctx)
	defer cancel()
	stream, err := c.Client.ListAndWatch(cctx, &pluginapi.Empty{})
	if err != nil {
		return message{}, false
	}
	resp, err := stream.Recv()
	if err != nil {
		return message{}, false
	}
	return message{At: time.Now(), Devices: resp.Devices}, true
}

// quoteSome quotes the first n of ids, and says how many more there are.
func quoteSome(ids []string, n int) string {
	q := make([]string, 0, n)
	for _, id := range ids[:min(n, len(ids))] {
		q = append(q, strconv.Quote(id))
	}
	if len(ids) > n {
		q = append(q, fmt.Sprintf("and %d more", len(ids)-n))
	}
	return strings.Join(q, ", ")
}

// idProblem says what is wrong with a device ID: bad is a control or
// format character (a newline, an escape, a bidirectional override),
// odd a path separator; "" when nothing is.
func idProblem(id string) (bad, odd string) {
	for _, c := range id {
		if unicode.IsControl(c) || unicode.Is(unicode.Cf, c) {
			return fmt.Sprintf("%q has a control character (U+%04X)", id, c), ""
		}
	}
	if i := strings.IndexAny(id, `/\`); i >= 0 {
		return "", fmt.Sprintf("%q has a path separator (%q)", id, id[i:i+1])
	}
	return "", ""
}

// judgeDeviceIDs checks every device ID any stream received.
func judgeDeviceIDs(o *outcome, res string, streams []streamLog) {
	seen := map[string]bool{}
	var bad, odd []string
	for _, s := range streams {
		for _, m := range s.msgs {
			for _, d := range m.Devices {
				if d == nil || seen[d.ID] {
					continue
				}
				seen[d.ID] = true
				b, w := idProblem(d.ID)
				bad, odd = appendNonEmpty(bad, b), appendNonEmpty(odd, w)
			}
		}
	}
	sort.Strings(bad)
	sort.Strings(odd)
	some := func(list []string) string {
		if len(list) > 3 {
			return strings.Join(list[:3], "; ") + fmt.Sprintf("; and %d more", len(list)-3)
		}
		return strings.Join(list, "; ")
	}
	switch {
	case len(seen) == 0:
		o.skip(res, "no ListAndWatch message was received")
	case len(bad) > 0:
		o.fail(res, "%s: logs, the checkpoint, the PodResources API and paths built from the ID carry it; trim what you read (a sysfs value ends in a newline)", some(bad))
	case len(odd) > 0:
		o.warn(res, "%s: plugins and runtimes that build device paths or CDI names from IDs get a different path", some(odd))
	default:
		o.pass(res, "%d device IDs, none with a control character or path separator", len(seen))
	}
}

// checkPluginWatcher checks the plugins_registry path: in plugin-watcher
// mode the registration through it, otherwise whether the plugin's socket
// also answers GetInfo.
func (r *runner) checkPluginWatcher(ctx context.Context) {
	o := r.outcome()
	regs := r.emu.registrations()
	for _, res := range r.resources {
		if r.registry() {
			var refused []string
			accepted := 0
			for _, reg := range regs {
				if reg.Resource != res || reg.Via != viaRegistry {
					continue
				}
				if reg.Err != nil {
					refused = append(refused, reg.Err.Error())
				} else {
					accepted++
				}
			}
			switch {
			case len(refused) > 0:
				o.fail(res, "refused: %s", strings.Join(dedupe(refused), "; "))
			case accepted == 0:
				o.fail(res, "registered through kubelet.sock, not through %s", r.registryDir)
			default:
				o.pass(res, "registered through plugins_registry")
			}
			continue
		}
		c := r.emu.current(res)
		if c == nil {
			o.skip(res, "not registered any more")
			continue
		}
		cc, err := dialPlugin(c.Socket)
		if err != nil {
			o.skip(res, "cannot dial: %v", err)
			continue
		}
		cctx, cancel := r.callCtx(ctx)
		info, err := registerapi.NewRegistrationClient(cc).GetInfo(cctx, &registerapi.InfoRequest{})
		cancel()
		_ = cc.Close()
		switch {
		case status.Code(err) == codes.Unimplemented:
			o.skip(res, "the plugin registers through kubelet.sock only; run with --plugin-watcher to check a plugins_registry mode")
		case err != nil:
			o.fail(res, "GetInfo on the plugin socket failed: %s", statusMessage(err))
		case info.Type != registerapi.DevicePlugin:
			o.fail(res, "GetInfo answers type %q; the kubelet hands only %q to the device manager", info.Type, registerapi.DevicePlugin)
		case info.Name != res:
			o.fail(res, "GetInfo answers name %q, but the plugin registered %q", info.Name, res)
		default:
			if err := (registryHandler{e: r.emu}).validateOnly(info.Name, info.SupportedVersions); err != nil {
				o.fail(res, "the kubelet's plugin watcher would refuse it: %v", err)
			} else {
				o.pass(res, "the socket also answers GetInfo (%s, versions %v)", info.Name, info.SupportedVersions)
			}
		}
	}
	r.conclude(CheckPluginWatcher, o)
}

// checkRestarts deletes the plugin's socket, then restarts the emulated
// kubelet Restarts times, measuring how long re-registration takes and
// counting registrations.
func (r *runner) checkRestarts(ctx context.Context) {
	// Wait past the threshold to report how slow a slow plugin is.
	wait := r.cfg.ReregisterThreshold + 10*time.Second
	single := r.outcome()
	for _, res := range r.resources {
		if n := r.initial[res]; n > 1 {
			single.fail(res, "registered %d times at start", n)
		}
	}
	if r.registry() {
		r.skipAll("plugin-watcher mode: the kubelet keeps plugins_registry sockets across restarts and finds them again by itself", CheckKubeletRestart, CheckSocketDeleted)
		r.checkOldEndpoint()
		for _, res := range r.resources {
			single.pass(res, "one registration at start")
		}
		r.conclude(CheckSingleReg, single)
		return
	}

	r.checkSocketDeleted(ctx, single, wait)
	r.checkKubeletRestarts(ctx, single, wait)
	r.checkOldEndpoint()
	r.conclude(CheckSingleReg, single)
}

// checkSocketDeleted deletes each resource's socket and judges the
// re-registration (restart.socket-deleted); extra registrations count
// against single.
func (r *runner) checkSocketDeleted(ctx context.Context, single *outcome, wait time.Duration) {
	threshold, slow := r.cfg.ReregisterThreshold, r.cfg.ReregisterWarn
	// The plugin's own socket is deleted. The kubelet does not do that to
	// a live plugin, so whatever goes wrong is a warning; a re-registration
	// it provokes is what restart.old-endpoint judges.
	sd := r.outcome()
	for _, res := range r.resources {
		c := r.emu.current(res)
		if c == nil {
			sd.skip(res, "not registered any more")
			continue
		}
		before := len(r.emu.registrations())
		t0 := time.Now()
		if err := removeFile(c.Socket); err != nil {
			sd.skip(res, "could not delete the socket: %v", err)
			continue
		}
		var got registration
		r.emu.waitFor(ctx, wait, func() bool {
			for _, reg := range r.emu.regs[before:] {
				if reg.Resource == res && reg.At.After(t0) && (reg.Err == nil || reg.Recreated) {
					got = *reg
					return true
				}
			}
			return false
		})
		if got.At.IsZero() {
			sd.warn(res, "did not register again within %s of its socket being deleted", wait)
			continue
		}
		r.quiet(ctx)
		n := 0
		for _, reg := range r.emu.registrations()[before:] {
			if reg.Resource == res && reg.counted() {
				n++
			}
		}
		if n > 1 {
			single.fail(res, "registered %d times after its socket was deleted", n)
		}
		d := got.At.Sub(t0).Round(time.Millisecond)
		switch {
		case got.Err != nil:
			sd.warn(res, "registered again after %s, on the re-created %s, and the kubelet refused it (%v); see %s", d, filepath.Base(got.Endpoint), got.Err, CheckOldEndpoint)
		case d > threshold:
			sd.warn(res, "registered again after %s, above the %s threshold", d, threshold)
		case d > slow:
			sd.warn(res, "registered again after %s, over %s", d, slow)
		default:
			sd.pass(res, "registered again after %s", d)
		}
	}
	r.conclude(CheckSocketDeleted, sd)
}

// checkKubeletRestarts restarts the emulated kubelet Restarts times and
// judges how fast every resource registers again (restart.kubelet);
// extra registrations count against single.
func (r *runner) checkKubeletRestarts(ctx context.Context, single *outcome, wait time.Duration) {
	threshold, slow := r.cfg.ReregisterThreshold, r.cfg.ReregisterWarn
	// Kubelet restarts.
	kr := r.outcome()
	worst := map[string]time.Duration{}
	failed := map[string]bool{}
	for i := 1; i <= r.cfg.Restarts; i++ {
		created, err := r.emu.restart()
		if err != nil {
			kr.fail("", "%v", err)
			break
		}
		r.emu.mu.Lock()
		epoch := r.emu.epoch
		r.emu.mu.Unlock()
		at := map[string]time.Time{}
		r.emu.waitFor(ctx, wait, func() bool {
			for _, reg := range r.emu.regs {
				if reg.Epoch == epoch && reg.Err == nil {
					if _, ok := at[reg.Resource]; !ok {
						at[reg.Resource] = reg.At
					}
				}
			}
			for _, res := range r.resources {
				if _, ok := at[res]; !ok && !failed[res] {
					return false
				}
			}
			return true
		})
		missing := false
		for _, res := range r.resources {
			if failed[res] {
				continue
			}
			t, ok := at[res]
			if !ok {
				kr.fail(res, "restart %d of %d: did not register again within %s of kubelet.sock being re-created", i, r.cfg.Restarts, wait)
				failed[res] = true
				missing = true
				continue
			}
			d := t.Sub(created)
			worst[res] = max(worst[res], d)
			if d > threshold {
				kr.fail(res, "restart %d of %d: registered again after %s, above the %s threshold", i, r.cfg.Restarts, d.Round(time.Millisecond), threshold)
				failed[res] = true
			}
		}
		r.quiet(ctx)
		for res, n := range r.registrationCounts(epoch) {
			if n > 1 {
				single.fail(res, "restart %d: registered %d times", i, n)
			}
		}
		if missing && len(failed) == len(r.resources) {
			break
		}
	}
	for _, res := range r.resources {
		switch {
		case failed[res]:
		case worst[res] > slow:
			kr.warn(res, "%d restarts; slowest re-registration %s, over %s: the node lacks the resource that long after every kubelet restart (threshold %s)", r.cfg.Restarts, worst[res].Round(time.Millisecond), slow, threshold)
		default:
			kr.pass(res, "%d restarts; slowest re-registration %s (threshold %s)", r.cfg.Restarts, worst[res].Round(time.Millisecond), threshold)
		}
		single.pass(res, "one registration per start and restart")
	}
	r.conclude(CheckKubeletRestart, kr)
}

// checkOldEndpoint judges every registration of the run that came while
// the emulated kubelet was still connected to the same resource: one on a
// socket path the plugin re-created while the kubelet's connection to the
// old socket there stayed open fails, as the kubelet refuses it.
func (r *runner) checkOldEndpoint() {
	o := r.outcome()
	regs := r.emu.registrations()
	for _, res := range r.resources {
		var refused, again []string
		prev := map[int]string{} // epoch -> endpoint of the latest accepted registration
		for _, reg := range regs {
			if reg.Resource != res {
				continue
			}
			if reg.Recreated {
				refused = append(refused, fmt.Sprintf("at %s it registered %s again after re-creating that socket, while the kubelet's connection to the old one was still open; the kubelet refused it: %v. Close the old connections (stop the old gRPC server) before registering, or listen on a new socket path",
					r.since(reg.At), filepath.Base(reg.Endpoint), reg.Err))
				continue
			}
			if reg.Err != nil {
				continue
			}
			switch p, ok := prev[reg.Epoch]; {
			case ok && p == reg.Endpoint:
				again = append(again, fmt.Sprintf("on the same socket %s after the old connection closed", filepath.Base(reg.Endpoint)))
			case ok:
				again = append(again, fmt.Sprintf("on a new socket %s (was %s)", filepath.Base(reg.Endpoint), filepath.Base(p)))
			}
			prev[reg.Epoch] = reg.Endpoint
		}
		switch {
		case len(refused) > 0:
			more := ""
			if len(refused) > 1 {
				more = fmt.Sprintf(" (%d such registrations)", len(refused))
			}
			o.fail(res, "%s%s", refused[0], more)
		case len(again) > 0:
			o.pass(res, "registered again %s", strings.Join(dedupe(again), "; "))
		case r.registry():
			o.skip(res, "plugin-watcher mode: the plugin did not register again while connected")
		default:
			o.skip(res, "the plugin did not register again while the kubelet was connected to it; see %s", CheckSocketDeleted)
		}
	}
	r.conclude(CheckOldEndpoint, o)
}
