package topology

import (
	"reflect"
	"testing"
)

func mask(t *testing.T, nodes ...int) Mask {
	t.Helper()
	m, err := NewMask(nodes...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestMask(t *testing.T) {
	t.Parallel()
	m := mask(t, 3, 0, 3)
	if got := m.Nodes(); !reflect.DeepEqual(got, []int{0, 3}) {
		t.Fatalf("Nodes() = %v", got)
	}
	if m.Count() != 2 || !m.IsSet(3) || m.IsSet(1) || m.String() != "0,3" {
		t.Fatalf("unexpected mask %v", m)
	}
	if _, err := NewMask(64); err == nil {
		t.Fatal("NewMask(64) did not fail")
	}
	if !mask(t, 1).IsNarrowerThan(mask(t, 0, 1)) || !mask(t, 0, 1).IsNarrowerThan(mask(t, 0, 2)) {
		t.Fatal("IsNarrowerThan ordering wrong")
	}
	var got []Mask
	IterateMasks([]int{0, 1, 2}, func(m Mask) { got = append(got, m) })
	want := []Mask{mask(t, 0), mask(t, 1), mask(t, 2), mask(t, 0, 1), mask(t, 0, 2), mask(t, 1, 2), mask(t, 0, 1, 2)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("IterateMasks = %v, want %v", got, want)
	}
}

func TestDeviceHints(t *testing.T) {
	t.Parallel()
	n0, n1, n01 := Mask(1), Mask(2), Mask(3)
	tests := []struct {
		name                     string
		all, available, reusable DeviceGroups
		request                  int
		want                     []Hint
	}{
		{
			name:      "one device per node, request 1",
			all:       DeviceGroups{n0: 1, n1: 1},
			available: DeviceGroups{n0: 1, n1: 1},
			request:   1,
			want:      []Hint{{n0, true}, {n1, true}, {n01, false}},
		},
		{
			name:      "request 2 needs both nodes",
			all:       DeviceGroups{n0: 1, n1: 1},
			available: DeviceGroups{n0: 1, n1: 1},
			request:   2,
			want:      []Hint{{n01, true}},
		},
		{
			name:      "node 0 busy: only node 1 and both",
			all:       DeviceGroups{n0: 2, n1: 2},
			available: DeviceGroups{n1: 2},
			request:   2,
			want:      []Hint{{n1, true}, {n01, false}},
		},
		{
			name:      "preferred width follows all devices, not available ones",
			all:       DeviceGroups{n0: 2, n1: 2},
			available: DeviceGroups{n0: 1, n1: 1},
			request:   2,
			want:      []Hint{{n01, false}},
		},
		{
			name:      "reusable devices pin the node",
			all:       DeviceGroups{n0: 2, n1: 2},
			available: DeviceGroups{n1: 2},
			reusable:  DeviceGroups{n0: 1},
			request:   1,
			want:      []Hint{{n0, true}, {n01, false}},
		},
		{
			name:      "device on two nodes",
			all:       DeviceGroups{n01: 1},
			available: DeviceGroups{n01: 1},
			request:   1,
			want:      []Hint{{n0, true}, {n1, true}, {n01, false}},
		},
		{
			name:      "not enough devices",
			all:       DeviceGroups{n0: 1},
			available: DeviceGroups{n0: 1},
			request:   2,
			want:      []Hint{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := DeviceHints([]int{0, 1}, tc.all, tc.available, tc.reusable, tc.request)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("DeviceHints = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	n0, n1, n01 := Mask(1), Mask(2), Mask(3)
	twoNodeDev := map[string][]Hint{"example.com/dev": {{n0, true}, {n1, true}, {n01, false}}}
	crossDev := map[string][]Hint{"example.com/dev": {{n01, true}}}
	onlyN1 := map[string][]Hint{"example.com/dev": {{n1, true}, {n01, false}}}
	impossible := map[string][]Hint{"example.com/dev": {}}
	noPref := map[string][]Hint{"example.com/dev": nil}
	conflicting := map[string][]Hint{
		"example.com/a": {{n0, true}, {n01, false}},
		"example.com/b": {{n1, true}, {n01, false}},
	}
	tests := []struct {
		policy    string
		hints     map[string][]Hint
		want      Hint
		wantAdmit bool
	}{
		{PolicyNone, twoNodeDev, Hint{}, true},
		{PolicyNone, impossible, Hint{}, true},
		{PolicyBestEffort, twoNodeDev, Hint{n0, true}, true},
		{PolicyBestEffort, onlyN1, Hint{n1, true}, true},
		{PolicyBestEffort, crossDev, Hint{n01, true}, true},
		{PolicyBestEffort, impossible, Hint{n01, false}, true},
		{PolicyBestEffort, noPref, Hint{n01, true}, true},
		{PolicyBestEffort, conflicting, Hint{n0, false}, true},
		{PolicyRestricted, twoNodeDev, Hint{n0, true}, true},
		{PolicyRestricted, crossDev, Hint{n01, true}, true},
		{PolicyRestricted, impossible, Hint{n01, false}, false},
		{PolicyRestricted, conflicting, Hint{n0, false}, false},
		{PolicySingleNUMANode, twoNodeDev, Hint{n0, true}, true},
		{PolicySingleNUMANode, onlyN1, Hint{n1, true}, true},
		{PolicySingleNUMANode, crossDev, Hint{0, false}, false},
		{PolicySingleNUMANode, noPref, Hint{0, true}, true},
		{PolicySingleNUMANode, impossible, Hint{0, false}, false},
	}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			p, err := NewPolicy(tc.policy, []int{0, 1})
			if err != nil {
				t.Fatal(err)
			}
			got, admit := p.Merge([]map[string][]Hint{tc.hints})
			if got != tc.want || admit != tc.wantAdmit {
				t.Fatalf("Merge(%v) = %v, %v; want %v, %v", tc.hints, got, admit, tc.want, tc.wantAdmit)
			}
		})
	}
}

func TestNewPolicyErrors(t *testing.T) {
	t.Parallel()
	if _, err := NewPolicy("bogus", []int{0}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	if _, err := NewPolicy(PolicyRestricted, nil); err == nil {
		t.Fatal("restricted without NUMA nodes accepted")
	}
	if _, err := NewPolicy(PolicyBestEffort, []int{0, 1, 2, 3, 4, 5, 6, 7, 8}); err == nil {
		t.Fatal("9 NUMA nodes accepted")
	}
	if p, err := NewPolicy("", nil); err != nil || p.Name() != PolicyNone {
		t.Fatalf("empty policy = %v, %v", p, err)
	}
}
