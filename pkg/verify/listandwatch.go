package verify

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The checks of ListAndWatch streams as they are opened and watched:
// listandwatch.first-message, listandwatch.concurrent-streams and
// listandwatch.health-updates.

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
