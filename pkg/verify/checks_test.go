package verify

import (
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func devs(ids ...string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, len(ids))
	for i, id := range ids {
		out[i] = &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	}
	return out
}

func TestFindPartial(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	msg := func(s int, ids ...string) message { return message{At: at(s), Devices: devs(ids...)} }
	tests := []struct {
		name        string
		streams     []streamLog
		partial     []partialUpdate
		updates     int
		unconfirmed int
	}{
		{name: "full lists", streams: []streamLog{
			{name: "k", msgs: []message{msg(0, "a", "b", "c"), msg(1, "a", "b", "c"), msg(2, "c", "b", "a")}},
		}, updates: 2},
		{name: "only the changed device, seen again by a later stream", streams: []streamLog{
			{name: "k", msgs: []message{msg(0, "a", "b", "c"), msg(1, "b")}},
			{name: "later", msgs: []message{msg(5, "a", "b", "c")}},
		}, partial: []partialUpdate{{stream: "k", index: 2, at: at(1), listed: 1, leftOut: []string{"a", "c"}}}, updates: 1},
		{name: "a device removed for good", streams: []streamLog{
			{name: "k", msgs: []message{msg(0, "a", "b", "c"), msg(1, "a", "b")}},
			{name: "later", msgs: []message{msg(5, "a", "b")}},
		}, updates: 1, unconfirmed: 1},
		{name: "left out, and no later stream to tell", streams: []streamLog{
			{name: "k", msgs: []message{msg(0, "a", "b"), msg(1, "b")}},
		}, updates: 1, unconfirmed: 1},
		{name: "an earlier stream does not confirm", streams: []streamLog{
			{name: "early", msgs: []message{msg(0, "a", "b")}},
			{name: "k", msgs: []message{msg(1, "a", "b"), msg(2, "b")}},
		}, updates: 1, unconfirmed: 1},
		{name: "no updates", streams: []streamLog{{name: "k", msgs: []message{msg(0, "a")}}, {name: "w"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			partial, updates, unconfirmed := findPartial(tt.streams)
			if !reflect.DeepEqual(partial, tt.partial) || updates != tt.updates || unconfirmed != tt.unconfirmed {
				t.Errorf("findPartial = %+v, %d updates, %d unconfirmed; want %+v, %d, %d", partial, updates, unconfirmed, tt.partial, tt.updates, tt.unconfirmed)
			}
		})
	}
}

// TestPreferredQueries checks that the questions depend only on the set of
// healthy devices, and that a plugin that ignores mustInclude fails one of
// them whatever rule it picks devices by, while one that honours it passes.
func TestPreferredQueries(t *testing.T) {
	t.Parallel()
	listed := []string{"dev-4", "dev-0", "dev-6", "dev-2", "dev-1", "dev-5", "dev-3"}
	want := preferredQueries(listed)
	for i := range 20 {
		shuffled := slices.Clone(listed)
		// A deterministic permutation per i.
		for j := range shuffled {
			k := (j*7 + i*3) % len(shuffled)
			shuffled[j], shuffled[k] = shuffled[k], shuffled[j]
		}
		if got := preferredQueries(shuffled); !reflect.DeepEqual(got, want) {
			t.Fatalf("order %v gives queries %v, order %v gives %v", shuffled, got, listed, want)
		}
	}
	if len(want) != 3 || want[0].size != 3 {
		t.Fatalf("queries %v: want 3 of size 3", want)
	}

	strategies := map[string]func(q preferredQuery) []string{
		"first of the list": func(q preferredQuery) []string { return q.available[:q.size] },
		"last of the list":  func(q preferredQuery) []string { return q.available[len(q.available)-q.size:] },
		"its own order": func(q preferredQuery) []string {
			own := []string{"dev-3", "dev-5", "dev-1", "dev-0", "dev-2", "dev-4", "dev-6"}
			return own[:q.size]
		},
	}
	for _, healthy := range [][]string{listed, {"b", "a"}, {"x", "z", "y"}} {
		for name, pick := range strategies {
			if name == "its own order" && len(healthy) != len(listed) {
				continue
			}
			missed := false
			for _, q := range preferredQueries(healthy) {
				if _, must, _ := (preferredAnswer{q: q, ids: pick(q)}).judge(); must != "" {
					missed = true
				}
			}
			if !missed {
				t.Errorf("%v: a plugin that takes %s and ignores mustInclude passes every query", healthy, name)
			}
		}
		for _, q := range preferredQueries(healthy) {
			ids := []string{q.must}
			for _, id := range q.available {
				if len(ids) < q.size && id != q.must {
					ids = append(ids, id)
				}
			}
			if s, m, a := (preferredAnswer{q: q, ids: ids}).judge(); s+m+a != "" {
				t.Errorf("%v: a correct answer %v to %v is judged %q %q %q", healthy, ids, q, s, m, a)
			}
		}
	}
	if q := preferredQueries([]string{"only"}); q != nil {
		t.Errorf("one device gives queries %v, want none", q)
	}
}

func TestIDProblem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ id, bad, odd string }{
		{id: "dev-0"},
		{id: "0000:3b:00.0"},
		{id: "GPU-é1"},
		{id: "dev-3\n", bad: `"dev-3\n" has a control character (U+000A)`},
		{id: "a\x1b[2Jb", bad: `"a\x1b[2Jb" has a control character (U+001B)`},
		{id: "gpu\u202e0", bad: `"gpu\u202e0" has a control character (U+202E)`},
		{id: "MIG-GPU-1/0/0", odd: `"MIG-GPU-1/0/0" has a path separator ("/")`},
		{id: `..\x`, odd: `"..\\x" has a path separator ("\\")`},
	} {
		bad, odd := idProblem(tc.id)
		if bad != tc.bad || odd != tc.odd {
			t.Errorf("idProblem(%q) = %q, %q; want %q, %q", tc.id, bad, odd, tc.bad, tc.odd)
		}
	}
}

func TestSameHealth(t *testing.T) {
	t.Parallel()
	d := func(id, h string) *pluginapi.Device { return &pluginapi.Device{ID: id, Health: h} }
	full := []*pluginapi.Device{d("a", pluginapi.Healthy), d("b", pluginapi.Unhealthy)}
	for _, tc := range []struct {
		name string
		a, b []*pluginapi.Device
		want bool
	}{
		{"equal", full, full, true},
		{"one partial list", full, []*pluginapi.Device{d("b", pluginapi.Unhealthy)}, true},
		{"disagree", full, []*pluginapi.Device{d("a", pluginapi.Healthy), d("b", pluginapi.Healthy)}, false},
		{"nothing in common", full, []*pluginapi.Device{d("c", pluginapi.Healthy)}, false},
	} {
		if got := sameHealth(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: sameHealth = %t, want %t", tc.name, got, tc.want)
		}
	}
}

func TestFindVanished(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	msg := func(s int, ids ...string) message {
		return message{At: t0.Add(time.Duration(s) * time.Second), Devices: devs(ids...)}
	}
	tests := []struct {
		name    string
		streams []streamLog
		want    []vanishing
		updates int
	}{
		{name: "full lists", streams: []streamLog{{name: "k", msgs: []message{msg(0, "a", "b"), msg(1, "b", "a")}}}, updates: 1},
		{name: "a device added", streams: []streamLog{{name: "k", msgs: []message{msg(0, "a"), msg(1, "a", "b")}}}, updates: 1},
		{name: "only the changed device, kept as the list", streams: []streamLog{
			{name: "k", msgs: []message{msg(0, "a", "b", "c", "d"), msg(1, "d")}},
			{name: "later", msgs: []message{msg(5, "d")}},
		}, want: []vanishing{{stream: "k", index: 2, at: t0.Add(time.Second), before: 4, now: 1, gone: []string{"a", "b", "c"}}}, updates: 1},
		{name: "gone and back", streams: []streamLog{
			{name: "k", msgs: []message{msg(0, "a", "b"), msg(1, "b"), msg(2, "b"), msg(3, "a", "b")}},
		}, want: []vanishing{{stream: "k", index: 2, at: t0.Add(time.Second), before: 2, now: 1, gone: []string{"a"}, back: 4}}, updates: 3},
		{name: "a new stream is not compared with an old one", streams: []streamLog{
			{name: "old", msgs: []message{msg(0, "a", "b")}},
			{name: "new", msgs: []message{msg(1, "b")}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, updates := findVanished(tt.streams)
			if !reflect.DeepEqual(got, tt.want) || updates != tt.updates {
				t.Errorf("findVanished = %+v, %d updates; want %+v, %d", got, updates, tt.want, tt.updates)
			}
		})
	}
}

// The every-device requests depend only on the set of healthy devices,
// cover each sampled device alone and in a pair, and stay bounded for a
// resource with many devices.
func TestEveryDeviceRequests(t *testing.T) {
	t.Parallel()
	ids := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("dev-%05d", i)
		}
		return out
	}
	tests := []struct {
		name      string
		healthy   []string
		alone     []string
		pairs     [][]string
		allLength int
	}{
		{name: "none"},
		{name: "one", healthy: []string{"a"}, alone: []string{"a"}},
		{name: "two", healthy: []string{"b", "a"}, alone: []string{"a", "b"}, pairs: [][]string{{"a", "b"}}},
		{name: "three", healthy: []string{"c", "a", "b", "a"}, alone: []string{"a", "b", "c"}, pairs: [][]string{{"a", "b"}, {"c", "a"}}, allLength: 3},
		{name: "four", healthy: []string{"d", "c", "b", "a"}, alone: []string{"a", "b", "c", "d"}, pairs: [][]string{{"a", "b"}, {"c", "d"}}, allLength: 4},
	}
	for _, tt := range tests {
		alone, pairs, all := everyDeviceRequests(tt.healthy)
		if !slices.Equal(alone, tt.alone) || !reflect.DeepEqual(pairs, tt.pairs) || len(all) != tt.allLength {
			t.Errorf("%s: everyDeviceRequests(%q) = %q, %q, %q; want %q, %q and %d together", tt.name, tt.healthy, alone, pairs, all, tt.alone, tt.pairs, tt.allLength)
		}
	}

	many := ids(10000)
	alone, pairs, all := everyDeviceRequests(many)
	if len(alone) != everyDeviceAlone || alone[0] != many[0] || alone[len(alone)-1] != many[len(many)-1] {
		t.Errorf("10000 devices: %d alone from %q to %q, want %d from the first to the last", len(alone), alone[0], alone[len(alone)-1], everyDeviceAlone)
	}
	if !slices.IsSorted(alone) || len(slices.Compact(slices.Clone(alone))) != len(alone) {
		t.Errorf("10000 devices: the sample has duplicates or is out of order")
	}
	if calls := len(alone) + len(pairs) + 1; len(pairs) != everyDeviceAlone/2 || len(all) != everyDeviceAlone || calls > 385 {
		t.Errorf("10000 devices: %d pairs, %d together, %d calls; want %d, %d, at most 385", len(pairs), len(all), calls, everyDeviceAlone/2, everyDeviceAlone)
	}
	reversed := slices.Clone(many)
	slices.Reverse(reversed)
	if a2, p2, all2 := everyDeviceRequests(reversed); !slices.Equal(a2, alone) || !reflect.DeepEqual(p2, pairs) || !slices.Equal(all2, all) {
		t.Errorf("the requests depend on the order the devices are listed in")
	}
}
