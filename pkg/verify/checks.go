package verify

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

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

func appendNonEmpty(list []string, s string) []string {
	if s == "" {
		return list
	}
	return append(list, s)
}

// devicesWith returns devices with the given IDs.
func devicesWith(ids []string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		out[i] = &pluginapi.Device{ID: id}
	}
	return out
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
