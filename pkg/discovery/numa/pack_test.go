package numa

import (
	"fmt"
	"slices"
	"testing"
)

func cands(spec ...string) []Candidate {
	// "id@node" or "id@node/group"
	var out []Candidate
	for _, s := range spec {
		var c Candidate
		var node int
		var rest string
		for i := len(s) - 1; i >= 0; i-- {
			if s[i] == '@' {
				c.ID, rest = s[:i], s[i+1:]
				break
			}
		}
		if n, err := fmt.Sscanf(rest, "%d", &node); n != 1 || err != nil {
			panic(s)
		}
		for i := 0; i < len(rest); i++ {
			if rest[i] == '/' {
				c.Group = rest[i+1:]
			}
		}
		c.Node = node
		out = append(out, c)
	}
	return out
}

func TestPack(t *testing.T) {
	t.Parallel()
	dgx := cands("g0@0", "g1@0", "g2@0", "g3@0", "g4@1", "g5@1", "g6@1", "g7@1")
	tests := []struct {
		name      string
		available []Candidate
		must      []string
		size      int
		want      []string
	}{
		{"one fits on a node", dgx, nil, 1, []string{"g0"}},
		{"four on one node", dgx, nil, 4, []string{"g0", "g1", "g2", "g3"}},
		{"five need two nodes", dgx, nil, 5, []string{"g0", "g1", "g2", "g3", "g4"}},
		{"mustInclude pulls its node first", dgx, []string{"g6"}, 3, []string{"g6", "g4", "g5"}},
		{"mustInclude across nodes fills both before a third",
			cands("a@0", "b@0", "c@1", "d@1", "e@2", "f@2", "g@2"), []string{"a", "c"}, 4, []string{"a", "c", "b", "d"}},
		{"best fit leaves the larger node whole",
			cands("a@0", "b@0", "c@0", "d@0", "e@1", "f@1"), nil, 2, []string{"e", "f"}},
		{"largest node first when none fits",
			cands("a@0", "b@1", "c@1", "d@1", "e@2", "f@2"), nil, 5, []string{"b", "c", "d", "e", "f"}},
		{"no locality used last", cands("x@-1", "y@-1", "a@1"), nil, 2, []string{"a", "x"}},
		{"not enough available", cands("a@0"), nil, 3, []string{"a"}},
		{"mustInclude not available is kept", cands("a@0"), []string{"zz"}, 2, []string{"zz", "a"}},
		{"replicas spread over GPUs",
			cands("u0::0@0/u0", "u0::1@0/u0", "u1::0@0/u1", "u1::1@0/u1", "u2::0@1/u2"), nil, 2, []string{"u0::0", "u1::0"}},
		{"replicas spread counts mustInclude",
			cands("u0::0@0/u0", "u0::1@0/u0", "u1::0@0/u1", "u1::1@0/u1"), []string{"u0::1"}, 2, []string{"u0::1", "u1::0"}},
		{"size zero", dgx, nil, 0, []string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Pack(tt.available, tt.must, tt.size)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Pack(size %d, must %v) = %v, want %v", tt.size, tt.must, got, tt.want)
			}
		})
	}
}

// TestPackSpansFewestNodes checks the node count against brute force on
// small random layouts.
func TestPackSpansFewestNodes(t *testing.T) {
	t.Parallel()
	for layout := 0; layout < 200; layout++ {
		var avail []Candidate
		sizes := []int{layout % 4, (layout / 4) % 5, (layout / 20) % 3, 1 + layout%2}
		for node, n := range sizes {
			for i := 0; i < n; i++ {
				avail = append(avail, Candidate{ID: fmt.Sprintf("n%dd%d", node, i), Node: node})
			}
		}
		for size := 1; size <= len(avail); size++ {
			got := Pack(avail, nil, size)
			if len(got) != size {
				t.Fatalf("layout %v size %d: got %d IDs", sizes, size, len(got))
			}
			if n, best := spanned(avail, got), minNodes(sizes, size); n != best {
				t.Errorf("layout %v size %d: %v spans %d nodes, %d possible", sizes, size, got, n, best)
			}
		}
	}
}

func spanned(avail []Candidate, ids []string) int {
	nodes := map[int]bool{}
	for _, c := range avail {
		if slices.Contains(ids, c.ID) {
			nodes[c.Node] = true
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

func BenchmarkPack(b *testing.B) {
	var avail []Candidate
	for i := 0; i < 64; i++ {
		avail = append(avail, Candidate{ID: fmt.Sprintf("gpu-%d::%d", i/8, i%8), Node: i / 16, Group: fmt.Sprint(i / 8)})
	}
	for b.Loop() {
		Pack(avail, []string{"gpu-3::1"}, 12)
	}
}
