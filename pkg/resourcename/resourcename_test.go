package resourcename

import (
	"strings"
	"testing"
)

func TestProblems(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 63)
	for _, tc := range []struct {
		name, want string // want: substring of the problem; empty means valid
	}{
		{"example.com/foo", ""},
		{"nvidia.com/gpu", ""},
		{"example.com/" + long, ""},
		{"", "is empty"},
		{"foo", "must be domain-qualified, like example.com/foo"},
		{"kubernetes.io/foo", "reserved for Kubernetes"},
		{"sub.kubernetes.io/foo", "reserved for Kubernetes"},
		{"requests.example.com/foo", `must not start with "requests."`},
		{"example.com/" + long + "a", "no more than 63"},
		{"example.com/a/b", "label key"},
		{strings.Repeat("a", 246) + ".com/x", `with the "requests." prefix`},
	} {
		got := strings.Join(Problems(tc.name), "; ")
		switch {
		case tc.want == "" && got != "":
			t.Errorf("%q: unexpected problems %q", tc.name, got)
		case tc.want != "" && !strings.Contains(got, tc.want):
			t.Errorf("%q: problems %q, want one containing %q", tc.name, got, tc.want)
		}
		if Valid(tc.name) != (tc.want == "") {
			t.Errorf("Valid(%q) = %v", tc.name, Valid(tc.name))
		}
	}
}

func TestDriverName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ resource, want string }{
		{"nvidia.com/gpu", "gpu.nvidia.com"},
		{"amd.com/gpu", "gpu.amd.com"},
		{"example.com/foo", "foo.example.com"},
		{"Example.COM/Foo", "foo.example.com"},
		{"example.com/my_dev.v2", "my-dev-v2.example.com"},
		{"example.com/-x_", "x.example.com"},
		{"dpkit.io/serial", "serial.dpkit.io"},
		{"example.com/" + strings.Repeat("a", 62) + "_b", strings.Repeat("a", 62) + ".example.com"},
	} {
		if got := DriverName(tc.resource); got != tc.want {
			t.Errorf("DriverName(%q) = %q, want %q", tc.resource, got, tc.want)
		}
	}
}

func TestDRADeviceName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 70)
	for _, tc := range []struct{ id, want string }{
		{"gpu-0", "gpu-0"},
		{"GPU-0", "gpu-0-"},
		{"0000:3b:00.0", "0000-3b-00-0-"},
		{"--", "d-"},
		{long, strings.Repeat("a", 52) + "-"},
	} {
		got := DRADeviceName(tc.id)
		if !strings.HasPrefix(got, tc.want) || len(got) > 63 || (strings.HasSuffix(tc.want, "-") && len(got) != len(tc.want)+10) {
			t.Errorf("DRADeviceName(%q) = %q, want %q plus a hash where it ends in '-'", tc.id, got, tc.want)
		}
		if got != DRADeviceName(tc.id) {
			t.Errorf("DRADeviceName(%q) is not stable", tc.id)
		}
	}
	if a, b := DRADeviceName("GPU-0"), DRADeviceName("gpu_0"); a == b || a == "gpu-0" || b == "gpu-0" {
		t.Errorf("IDs that clean up alike collide: %q %q", a, b)
	}
}
