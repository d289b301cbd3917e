package deviceplugin

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
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

// cands builds healthy devices from "id@node" or "id@node/group" (node -1:
// no NUMA information) and the group function for them.
func cands(spec ...string) ([]Device, func(string) string) {
	var out []Device
	groups := map[string]string{}
	for _, s := range spec {
		id, rest, _ := strings.Cut(s, "@")
		node, g, _ := strings.Cut(rest, "/")
		n, err := strconv.ParseInt(node, 10, 64)
		if err != nil {
			panic(s)
		}
		d := Device{ID: id, Healthy: true}
		if n >= 0 {
			d.NUMANodes = []int64{n}
		}
		groups[id] = g
		out = append(out, d)
	}
	return out, func(id string) string { return groups[id] }
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

func TestPackNUMAGroups(t *testing.T) {
	t.Parallel()
	dgx := []string{"g0@0", "g1@0", "g2@0", "g3@0", "g4@1", "g5@1", "g6@1", "g7@1"}
	for _, tc := range []struct {
		name string
		spec []string
		must []string
		size int
		want []string
	}{
		{"one fits on a node", dgx, nil, 1, []string{"g0"}},
		{"four on one node", dgx, nil, 4, []string{"g0", "g1", "g2", "g3"}},
		{"five need two nodes", dgx, nil, 5, []string{"g0", "g1", "g2", "g3", "g4"}},
		{"mustInclude pulls its node first", dgx, []string{"g6"}, 3, []string{"g6", "g4", "g5"}},
		{"mustInclude across nodes fills both before a third",
			[]string{"a@0", "b@0", "c@1", "d@1", "e@2", "f@2", "g@2"}, []string{"a", "c"}, 4, []string{"a", "c", "b", "d"}},
		{"best fit leaves the larger node whole", []string{"a@0", "b@0", "c@0", "d@0", "e@1", "f@1"}, nil, 2, []string{"e", "f"}},
		{"largest node first when none fits", []string{"a@0", "b@1", "c@1", "d@1", "e@2", "f@2"}, nil, 5, []string{"b", "c", "d", "e", "f"}},
		{"no locality used last", []string{"x@-1", "y@-1", "a@1"}, nil, 2, []string{"a", "x"}},
		{"not enough available", []string{"a@0"}, nil, 3, []string{"a"}},
		{"mustInclude not available is kept", []string{"a@0"}, []string{"zz"}, 2, []string{"zz", "a"}},
		{"replicas spread over GPUs",
			[]string{"u0::0@0/u0", "u0::1@0/u0", "u1::0@0/u1", "u1::1@0/u1", "u2::0@1/u2"}, nil, 2, []string{"u0::0", "u1::0"}},
		{"replicas spread counts mustInclude",
			[]string{"u0::0@0/u0", "u0::1@0/u0", "u1::0@0/u1", "u1::1@0/u1"}, []string{"u0::1"}, 2, []string{"u0::1", "u1::0"}},
		{"size zero", dgx, nil, 0, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			avail, group := cands(tc.spec...)
			got := PackNUMAGroups(PreferredAllocationRequest{Available: avail, MustInclude: tc.must, Size: tc.size}, group)
			if !slices.Equal(got, tc.want) {
				t.Errorf("PackNUMAGroups(size %d, must %v) = %v, want %v", tc.size, tc.must, got, tc.want)
			}
		})
	}
}

// TestPackNUMASpansFewestNodes checks the node count against brute force on
// small layouts.
func TestPackNUMASpansFewestNodes(t *testing.T) {
	t.Parallel()
	for layout := range 200 {
		var avail []Device
		sizes := []int{layout % 4, (layout / 4) % 5, (layout / 20) % 3, 1 + layout%2}
		for node, n := range sizes {
			for i := range n {
				avail = append(avail, Device{ID: fmt.Sprintf("n%dd%d", node, i), Healthy: true, NUMANodes: []int64{int64(node)}})
			}
		}
		for size := 1; size <= len(avail); size++ {
			got := PackNUMA(PreferredAllocationRequest{Available: avail, Size: size})
			if len(got) != size {
				t.Fatalf("layout %v size %d: got %d IDs", sizes, size, len(got))
			}
			if n, best := spanned(avail, got), minNodes(sizes, size); n != best {
				t.Errorf("layout %v size %d: %v spans %d nodes, %d possible", sizes, size, got, n, best)
			}
		}
	}
}

func spanned(avail []Device, ids []string) int {
	nodes := map[int64]bool{}
	for _, d := range avail {
		if slices.Contains(ids, d.ID) {
			nodes[numaOf(d)] = true
		}
	}
	return len(nodes)
}

func minNodes(sizes []int, size int) int {
	best := len(sizes) + 1
	for mask := 1; mask < 1<<len(sizes); mask++ {
		total, count := 0, 0
		for i, s := range sizes {
			if mask&(1<<i) != 0 && s > 0 {
				total += s
				count++
			}
		}
		if total >= size && count < best {
			best = count
		}
	}
	return best
}

func TestCompareIDs(t *testing.T) {
	t.Parallel()
	in := []string{"dev-10", "dev-2", "renderD1024", "renderD128", "a", "dev-02", "ttyUSB10", "ttyUSB2", "x99999999999999999999999", "x100000000000000000000000"}
	slices.SortFunc(in, CompareIDs)
	want := []string{"a", "dev-2", "dev-02", "dev-10", "renderD128", "renderD1024", "ttyUSB2", "ttyUSB10", "x99999999999999999999999", "x100000000000000000000000"}
	if !slices.Equal(in, want) {
		t.Errorf("sorted = %v\nwant     %v", in, want)
	}
}

func BenchmarkPackNUMAGroups(b *testing.B) {
	var avail []Device
	for i := range 64 {
		avail = append(avail, Device{ID: fmt.Sprintf("gpu-%d::%d", i/8, i%8), Healthy: true, NUMANodes: []int64{int64(i / 16)}})
	}
	group := func(id string) string { g, _, _ := strings.Cut(id, "::"); return g }
	req := PreferredAllocationRequest{Available: avail, MustInclude: []string{"gpu-3::1"}, Size: 12}
	for b.Loop() {
		PackNUMAGroups(req, group)
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

// FuzzAllocate drives the Allocate handler with arbitrary encoded requests:
// it must never panic, and it must either refuse the request with
// InvalidArgument or FailedPrecondition or answer exactly one response per
// container, each for known, healthy devices only.
func FuzzAllocate(f *testing.F) {
	r := &resource{name: "example.com/foo", plugin: echoPlugin{}, log: slog.New(slog.DiscardHandler)}
	r.devices = newDeviceSet(nil)
	r.devices.update([]Device{{ID: "a", Healthy: true}, {ID: "b"}, {ID: "c", Healthy: true}})
	svc := service{r: r}
	seed := func(reqs ...[]string) []byte {
		m := &pluginapi.AllocateRequest{}
		for _, ids := range reqs {
			m.ContainerRequests = append(m.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
		}
		b, _ := proto.Marshal(m)
		return b
	}
	f.Add(seed([]string{"a"}, []string{"c"}))
	f.Add(seed([]string{"a", "a"}))
	f.Add(seed([]string{"b"}))
	f.Add(seed())
	f.Add([]byte{0x0a, 0x03, 0x0a, 0x01, 0x7a})
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &pluginapi.AllocateRequest{}
		if proto.Unmarshal(data, req) != nil {
			return
		}
		resp, err := svc.allocate(context.Background(), req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.FailedPrecondition {
				t.Fatalf("refused with %v: %v", c, err)
			}
			return
		}
		if len(resp.ContainerResponses) != len(req.ContainerRequests) {
			t.Fatalf("%d responses for %d containers", len(resp.ContainerResponses), len(req.ContainerRequests))
		}
		for i, cr := range req.ContainerRequests {
			if got := resp.ContainerResponses[i].Envs["IDS"]; got != strings.Join(cr.DevicesIds, ",") {
				t.Fatalf("container %d answered for %q, asked %v", i, got, cr.DevicesIds)
			}
			for _, id := range cr.DevicesIds {
				if d := r.devices.current().byID[id]; !d.Healthy {
					t.Fatalf("allocated unknown or unhealthy %q", id)
				}
			}
		}
	})
}

type echoPlugin struct{}

func (echoPlugin) Scan(ctx context.Context, _ func([]Device)) error { <-ctx.Done(); return nil }

func (echoPlugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"IDS": strings.Join(ids, ",")}}, nil
}
