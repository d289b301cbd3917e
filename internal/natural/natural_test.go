package natural

import (
	"slices"
	"testing"
)

func TestSort(t *testing.T) {
	t.Parallel()
	in := []string{"dev-10", "dev-2", "renderD1024", "dev-002", "renderD128", "a", "dev-1", ""}
	Sort(in)
	want := []string{"", "a", "dev-1", "dev-2", "dev-002", "dev-10", "renderD128", "renderD1024"}
	if !slices.Equal(in, want) {
		t.Fatalf("Sort = %q, want %q", in, want)
	}
}
