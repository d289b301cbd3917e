package draverify

import (
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// write is one event of the slice watch: slice name in generation gen of
// a pool of count slices, with devices.
type write struct {
	typ     watch.EventType
	name    string
	gen     int64
	count   int64
	devices string // comma-separated names; "x=v" sets attribute x
}

func (w write) slice(rv int) *resourcev1.ResourceSlice {
	node := "node-a"
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: w.name, ResourceVersion: strconv.Itoa(rv)},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: "d.example.com", NodeName: &node,
			Pool: resourcev1.ResourcePool{Name: "pool", Generation: w.gen, ResourceSliceCount: w.count},
		},
	}
	for _, d := range strings.Split(w.devices, ",") {
		if d == "" {
			continue
		}
		name, attr, _ := strings.Cut(d, "=")
		dev := resourcev1.Device{Name: name}
		if attr != "" {
			dev.Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"x": {StringValue: &attr}}
		}
		s.Spec.Devices = append(s.Spec.Devices, dev)
	}
	return s
}

// The generation rule is the upstream ResourceSlice controller's
// (Controller.syncPool): every sequence of writes it makes passes, and
// each write it never makes fails.
func TestSliceWatchGeneration(t *testing.T) {
	t.Parallel()
	add, mod, del := watch.Added, watch.Modified, watch.Deleted
	tests := []struct {
		name    string
		writes  []write
		bad     string // in the one bad finding; "" for none
		changes int    // good findings
	}{
		{name: "first publication of two slices", writes: []write{
			{add, "s0", 1, 2, "a,b"}, {add, "s1", 1, 2, "c,d"},
		}},
		{name: "one slice of one updated in place", changes: 1, writes: []write{
			{add, "s0", 1, 1, "a,b"}, {mod, "s0", 1, 1, "a=2,b"},
		}},
		{name: "one slice of two updated in place", changes: 1, writes: []write{
			{add, "s0", 1, 2, "a,b"}, {add, "s1", 1, 2, "c,d"}, {mod, "s1", 1, 2, "c=2,d"},
		}},
		{name: "two publications, one slice each, in place", changes: 2, writes: []write{
			{add, "s0", 1, 2, "a,b"}, {add, "s1", 1, 2, "c,d"}, {mod, "s0", 1, 2, "a=2,b"}, {mod, "s1", 1, 2, "c=2,d"},
		}},
		{name: "device moved with a bump", changes: 2, writes: []write{
			{add, "s0", 1, 2, "a,b"}, {add, "s1", 1, 2, "c,d"}, {mod, "s1", 2, 2, "b,c,d"}, {mod, "s0", 2, 2, "a"},
		}},
		{name: "pool grown with a bump", writes: []write{
			{add, "s0", 1, 1, "a,b"}, {mod, "s0", 2, 2, "a,b"}, {add, "s1", 2, 2, "c"},
		}},
		{name: "pool shrunk in place: obsolete slice deleted, then one update", writes: []write{
			{add, "s0", 1, 2, "a,b"}, {add, "s1", 1, 2, "c,d"}, {del, "s1", 1, 2, "c,d"}, {mod, "s0", 1, 1, "a,b"},
		}},
		{name: "pool deleted and published again from generation 1", writes: []write{
			{add, "s0", 3, 1, "a"}, {del, "s0", 3, 1, "a"}, {add, "s0", 1, 1, "a"},
		}},
		{name: "generation backwards", bad: "s0 was written with generation 1, below generation 2 of pool pool", writes: []write{
			{add, "s0", 2, 1, "a"}, {mod, "s0", 1, 1, "a=2"},
		}},
		{name: "generation backwards in another slice", bad: "s1 was written with generation 1, below generation 2", writes: []write{
			{add, "s0", 2, 2, "a"}, {add, "s1", 2, 2, "b"}, {mod, "s1", 1, 2, "b"},
		}},
		{name: "device moved in place, gaining slice first", bad: "lists device b in both", changes: 2, writes: []write{
			{add, "s0", 1, 2, "a,b"}, {add, "s1", 1, 2, "c,d"}, {mod, "s1", 1, 2, "b,c,d"}, {mod, "s0", 1, 2, "a"},
		}},
		{name: "slice added to a complete generation", bad: "s1 was created in generation 1 of pool pool, which was complete", writes: []write{
			{add, "s0", 1, 1, "a"}, {mod, "s0", 1, 2, "a"}, {add, "s1", 1, 2, "b"},
		}},
		{name: "counts changed in place in one slice of two", bad: "disagree on resourceSliceCount", writes: []write{
			{add, "s0", 1, 2, "a"}, {add, "s1", 1, 2, "b"}, {mod, "s1", 1, 3, "b"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sw := &sliceWatch{node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}},
				live: map[string]sliceState{}, complete: map[poolKey]int64{}, written: map[string]time.Time{}}
			for i, w := range tc.writes {
				sw.record(w.typ, w.slice(i+1), time.Now())
			}
			var bad []string
			changes := 0
			for _, f := range sw.found {
				if f.bad {
					bad = append(bad, f.text)
				} else {
					changes++
				}
			}
			switch {
			case tc.bad == "" && len(bad) > 0:
				t.Errorf("bad %q, want none", bad)
			case tc.bad != "" && (len(bad) != 1 || !strings.Contains(bad[0], tc.bad)):
				t.Errorf("bad %q, want one with %q", bad, tc.bad)
			}
			if changes != tc.changes {
				t.Errorf("%d changes (%v), want %d", changes, sw.found, tc.changes)
			}
		})
	}
}
