package deviceplugin

import (
	"fmt"
	"slices"
	"testing"
)

func devs(numa ...int64) []Device {
	out := make([]Device, len(numa))
	for i, n := range numa {
		out[i] = Device{ID: fmt.Sprintf("dev-%d", i), Healthy: true}
		if n >= 0 {
			out[i].NUMANodes = []int64{n}
		}
	}
	return out
}

func TestPackNUMA(t *testing.T) {
	t.Parallel()
	unhealthy := devs(0, 0, 1, 1)
	unhealthy[0].Healthy = false
	for _, tc := range []struct {
		name string
		req  PreferredAllocationRequest
		want []string
	}{
		{"fits on the fuller-fitting node", PreferredAllocationRequest{Available: devs(0, 0, 0, 1, 1), Size: 2}, []string{"dev-3", "dev-4"}},
		{"best fit keeps big blocks", PreferredAllocationRequest{Available: devs(0, 0, 0, 0, 1, 1, 1), Size: 3}, []string{"dev-4", "dev-5", "dev-6"}},
		{"spills from the biggest node", PreferredAllocationRequest{Available: devs(0, 0, 1, 1, 1), Size: 4}, []string{"dev-2", "dev-3", "dev-4", "dev-0"}},
		{"must include pulls its node", PreferredAllocationRequest{Available: devs(0, 0, 1, 1, 1), MustInclude: []string{"dev-0"}, Size: 2}, []string{"dev-0", "dev-1"}},
		{"skips unhealthy", PreferredAllocationRequest{Available: unhealthy, Size: 2}, []string{"dev-2", "dev-3"}},
		{"no NUMA info", PreferredAllocationRequest{Available: devs(-1, -1, -1), Size: 2}, []string{"dev-0", "dev-1"}},
		{"natural order", PreferredAllocationRequest{Available: []Device{{ID: "dev-10", Healthy: true}, {ID: "dev-2", Healthy: true}}, Size: 1}, []string{"dev-2"}},
		{"not enough", PreferredAllocationRequest{Available: devs(0), Size: 3}, []string{"dev-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PackNUMA(tc.req); !slices.Equal(got, tc.want) {
				t.Errorf("PackNUMA = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestRepairPreferred(t *testing.T) {
	t.Parallel()
	req := PreferredAllocationRequest{Available: devs(0, 0, 1, 1), MustInclude: []string{"dev-3"}, Size: 2}
	for _, tc := range []struct {
		name   string
		answer []string
		want   []string
	}{
		{"valid answer kept in order", []string{"dev-2", "dev-3"}, []string{"dev-2", "dev-3"}},
		{"missing must include", []string{"dev-0", "dev-1"}, []string{"dev-3", "dev-0"}},
		{"unknown and duplicate dropped", []string{"x", "dev-3", "dev-3"}, []string{"dev-3", "dev-0"}},
		{"too long cut", []string{"dev-3", "dev-2", "dev-1"}, []string{"dev-3", "dev-2"}},
		{"empty topped up", nil, []string{"dev-3", "dev-0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := repairPreferred(req, tc.answer); !slices.Equal(got, tc.want) {
				t.Errorf("repairPreferred(%v) = %v, want %v", tc.answer, got, tc.want)
			}
		})
	}
}

// FuzzAllocateRequest checks that request validation never panics and only
// accepts known, healthy, distinct IDs.
func FuzzAllocateRequest(f *testing.F) {
	snap := buildSnapshot(1, []Device{{ID: "a", Healthy: true}, {ID: "b", Healthy: false}, {ID: "c", Healthy: true}})
	f.Add("a,c")
	f.Add("a,a")
	f.Add("b")
	f.Add("")
	f.Add("zz,\x00")
	f.Fuzz(func(t *testing.T, list string) {
		var ids []string
		start := 0
		for i := 0; i <= len(list); i++ {
			if i == len(list) || list[i] == ',' {
				if i > start {
					ids = append(ids, list[start:i])
				}
				start = i + 1
			}
		}
		err := checkAllocatable(snap, "containerRequests[0]", ids)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, id := range ids {
			d, ok := snap.byID[id]
			if !ok || !d.Healthy || seen[id] {
				t.Fatalf("accepted %q in %v", id, ids)
			}
			seen[id] = true
		}
		if len(ids) == 0 {
			t.Fatal("accepted an empty request")
		}
	})
}
