package verify

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

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
			o.warn(res, "the first message lists no devices: the node advertises 0 %s", res)
			continue
		}
		s := stateOf(first.Devices)
		o.pass(res, "%d devices (%d healthy) %s after registration", len(first.Devices), len(s.healthy), first.At.Sub(r.registeredAt(res)).Round(time.Millisecond))
	}
	r.conclude(CheckFirstMessage, o)
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
				if !slices.Equal(ids, wantIDs) {
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
		if len(problems) > 0 {
			o.fail(res, "%s", strings.Join(dedupe(problems), "; "))
		} else {
			o.pass(res, "%d more streams each got %d devices; the first stayed open", n, len(wantIDs))
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

func (r *runner) checkAllocate(ctx context.Context) {
	resp, unknown, unhealthy, conc := r.outcome(), r.outcome(), r.outcome(), r.outcome()
	for _, res := range r.resources {
		c := r.emu.current(res)
		st, ok := r.state(res)
		if c == nil || !ok {
			for _, o := range []*outcome{resp, unknown, unhealthy, conc} {
				o.skip(res, "no device list; see %s", CheckFirstMessage)
			}
			continue
		}
		// One response per container request.
		switch n := len(st.healthy); {
		case n == 0:
			resp.skip(res, "no healthy device to allocate")
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
		if len(st.healthy) == 0 {
			conc.skip(res, "no healthy device to allocate")
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
				o.skip(res, "needs at least 2 healthy devices, has %d", len(st.healthy))
			}
			continue
		}
		n := min(3, len(st.healthy))
		mustID := st.healthy[len(st.healthy)-1]
		cctx, cancel := r.callCtx(ctx)
		out, err := c.Client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{
			ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: st.healthy, MustIncludeDeviceIDs: []string{mustID}, AllocationSize: int32(n),
			}},
		})
		cancel()
		if status.Code(err) == codes.Unimplemented {
			for _, o := range all {
				o.skip(res, "answers Unimplemented; see %s", CheckOptions)
			}
			continue
		}
		if err == nil && len(out.ContainerResponses) != 1 {
			err = fmt.Errorf("1 container request got %d responses", len(out.ContainerResponses))
		}
		if err != nil {
			size.fail(res, "GetPreferredAllocation failed: %s", statusMessage(err))
			must.skip(res, "the call failed; see %s", CheckPrefSize)
			avail.skip(res, "the call failed; see %s", CheckPrefSize)
			continue
		}
		ids := out.ContainerResponses[0].DeviceIDs
		q := fmt.Sprintf("size %d of %d available, mustInclude [%s]", n, len(st.healthy), mustID)
		if len(ids) != n {
			size.fail(res, "asked %s, got %d IDs %v", q, len(ids), ids)
		} else {
			size.pass(res, "asked %s, got %v", q, ids)
		}
		if !slices.Contains(ids, mustID) {
			must.fail(res, "asked %s, got %v without %s", q, ids, mustID)
		} else {
			must.pass(res, "%s included", mustID)
		}
		var bad []string
		seen := map[string]bool{}
		for _, id := range ids {
			if !slices.Contains(st.healthy, id) {
				bad = append(bad, fmt.Sprintf("%q is not available", id))
			}
			if seen[id] {
				bad = append(bad, fmt.Sprintf("%q is returned twice", id))
			}
			seen[id] = true
		}
		if len(bad) > 0 {
			avail.fail(res, "asked %s: %s", q, strings.Join(bad, "; "))
		} else {
			avail.pass(res, "every ID is available")
		}
	}
	r.conclude(CheckPrefSize, size)
	r.conclude(CheckPrefMust, must)
	r.conclude(CheckPrefAvailable, avail)
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
			o.skip(res, "no healthy device")
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

func sameHealth(a, b []*pluginapi.Device) bool {
	ha, hb := healthOf(a), healthOf(b)
	if len(ha) != len(hb) {
		return false
	}
	for id, h := range ha {
		if hb[id] != h {
			return false
		}
	}
	return true
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

func (r *runner) checkMessageSize() {
	o := r.outcome()
	for _, res := range r.resources {
		largest, count := 0, 0
		var conns []*conn
		r.emu.mu.Lock()
		for _, c := range r.emu.history {
			if c.Resource == res {
				conns = append(conns, c)
			}
		}
		r.emu.mu.Unlock()
		if wc := r.watchers[res]; wc != nil {
			conns = append(conns, wc)
		}
		for _, c := range conns {
			msgs, _, _ := r.emu.messages(c)
			for _, m := range msgs {
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
	r.conclude(CheckMessageSize, o)
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
	threshold := r.cfg.ReregisterThreshold
	// Wait past the threshold to report how slow a slow plugin is.
	wait := threshold + 10*time.Second
	single := r.outcome()
	for _, res := range r.resources {
		if n := r.initial[res]; n > 1 {
			single.fail(res, "registered %d times at start", n)
		}
	}
	if r.registry() {
		r.skipAll("plugin-watcher mode: the kubelet keeps plugins_registry sockets across restarts and finds them again by itself", CheckKubeletRestart, CheckSocketDeleted)
		for _, res := range r.resources {
			single.pass(res, "one registration at start")
		}
		r.conclude(CheckSingleReg, single)
		return
	}

	// The plugin's own socket is deleted.
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
		var at time.Time
		r.emu.waitFor(ctx, wait, func() bool {
			for _, reg := range r.emu.regs[before:] {
				if reg.Resource == res && reg.Err == nil {
					at = reg.At
					return true
				}
			}
			return false
		})
		if at.IsZero() {
			sd.fail(res, "did not register again within %s of its socket being deleted", wait)
			continue
		}
		r.quiet(ctx)
		n := 0
		for _, reg := range r.emu.registrations()[before:] {
			if reg.Resource == res && reg.Err == nil {
				n++
			}
		}
		if n > 1 {
			single.fail(res, "registered %d times after its socket was deleted", n)
		}
		d := at.Sub(t0)
		if d > threshold {
			sd.fail(res, "registered again after %s, above the %s threshold", d.Round(time.Millisecond), threshold)
		} else {
			sd.pass(res, "registered again after %s", d.Round(time.Millisecond))
		}
	}
	r.conclude(CheckSocketDeleted, sd)

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
		for res, n := range r.acceptedCounts(epoch) {
			if n > 1 {
				single.fail(res, "restart %d: registered %d times", i, n)
			}
		}
		if missing && len(failed) == len(r.resources) {
			break
		}
	}
	for _, res := range r.resources {
		if !failed[res] {
			kr.pass(res, "%d restarts; slowest re-registration %s (threshold %s)", r.cfg.Restarts, worst[res].Round(time.Millisecond), threshold)
		}
		single.pass(res, "one registration per start and restart")
	}
	r.conclude(CheckKubeletRestart, kr)
	r.conclude(CheckSingleReg, single)
}
