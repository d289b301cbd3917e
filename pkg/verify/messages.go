package verify

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The checks judged from every ListAndWatch message the streams received:
// listandwatch.message-size, listandwatch.full-list,
// listandwatch.vanished-devices and listandwatch.device-ids.

// kubeletMaxMessage is the kubelet's gRPC receive limit (the default).
const kubeletMaxMessage = 4 << 20

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
