package plugins

import (
	"slices"
	"strings"
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

func TestVersionAttr(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in, version, str string
	}{
		{"580.65.6", "580.65.6", ""},
		{"550.90.07", "550.90.7", ""},
		{"1.2.3-rc.1+build.5", "1.2.3-rc.1+build.5", ""},
		{"535.104", "", "535.104"},
		{"6.8.0-01", "", "6.8.0-01"},
		{"v1.2.3", "", "v1.2.3"},
	} {
		a := VersionAttr(tc.in)
		switch {
		case tc.version != "" && (a.Version == nil || *a.Version != tc.version || a.String != nil):
			t.Errorf("VersionAttr(%q) = %+v, want version %q", tc.in, a, tc.version)
		case tc.str != "" && (a.String == nil || *a.String != tc.str || a.Version != nil):
			t.Errorf("VersionAttr(%q) = %+v, want string %q", tc.in, a, tc.str)
		}
	}
}

func TestSharePolicy(t *testing.T) {
	const mi, gi = int64(1) << 20, int64(1) << 30
	// An H200's 143771Mi in 1Gi steps: the default, all of it, rounded
	// down to min plus whole steps.
	c, err := SharePolicy{Min: "1Gi", Step: "1Gi"}.Capacity(143771*mi, "143771Mi")
	if err != nil || c.Default != 140*gi || c.Min != gi || c.Step != gi || c.Total != 143771*mi {
		t.Errorf("Capacity = %+v, %v; want default 140Gi", c, err)
	}
	for _, tc := range []struct {
		p    SharePolicy
		want string
	}{
		{SharePolicy{Step: "0"}, "step must be more than 0"},
		{SharePolicy{Min: "1Gi", Step: "1Gi", Default: "1536Mi"}, "default must be min plus a whole number of steps"},
		{SharePolicy{Min: "x"}, "min:"},
		{SharePolicy{Min: "2Gi", Default: "1Gi"}, "default must be at least min"},
	} {
		if err := tc.p.Check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%+v) = %v, want %q", tc.p, err, tc.want)
		}
	}
	if got := ReplicaAmount(c, 3); got != 46*gi {
		t.Errorf("a third of 143771Mi in 1Gi steps = %d, want 46Gi", got)
	}
}
