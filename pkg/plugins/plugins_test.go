package plugins

import (
	"slices"
	"testing"
)

func TestSharing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		s    Sharing
		id   string
		want []string
	}{
		{"not shared", Sharing{N: 1, Sep: "-"}, "ttyUSB-0", []string{"ttyUSB-0"}},
		{"zero is not shared", Sharing{Sep: "::"}, "GPU-1", []string{"GPU-1"}},
		{"count", Sharing{N: 2, Sep: "-"}, "ttyUSB-0", []string{"ttyUSB-0-0", "ttyUSB-0-1"}},
		{"replicas", Sharing{N: 3, Sep: "::"}, "GPU-a-b", []string{"GPU-a-b::0", "GPU-a-b::1", "GPU-a-b::2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := tc.s.IDs(tc.id)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("IDs(%q) = %q, want %q", tc.id, got, tc.want)
			}
			for _, id := range got {
				if d := tc.s.Device(id); d != tc.id {
					t.Errorf("Device(%q) = %q, want %q", id, d, tc.id)
				}
			}
		})
	}
}
