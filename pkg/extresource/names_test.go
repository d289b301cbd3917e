package extresource

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestValidateName(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 63)
	tests := []struct {
		name    string
		wantErr string // substring; empty means valid
	}{
		{"example.com/dongle", ""},
		{"example.com/dongle_2.v1", ""},
		{"a.b.example.com/x", ""},
		{"example.com/" + long, ""},
		{"", "Required value"},
		{"dongle", "must be domain-qualified, like example.com/dongle"},
		{"cpu", "must be domain-qualified"},
		{"kubernetes.io/dongle", "reserved for Kubernetes' own resources"},
		{"nvidia.kubernetes.io/gpu", "reserved for Kubernetes' own resources"},
		{"requests.example.com/dongle", `must not start with "requests."`},
		{"example.com/" + long + "a", "no more than 63"},
		{"example.com/-dongle", "alphanumeric"},
		{"Example_com/dongle", "prefix part"},
		{"example.com/a/b", "label key"},
		{strings.Repeat("a", 246) + ".com/x", `with the "requests." prefix`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			errs := ValidateName(tt.name, field.NewPath("name"))
			if tt.wantErr == "" {
				if len(errs) != 0 {
					t.Fatalf("ValidateName(%q) = %v, want valid", tt.name, errs)
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("ValidateName(%q) = valid, want error containing %q", tt.name, tt.wantErr)
			}
			if got := errs.ToAggregate().Error(); !strings.Contains(got, tt.wantErr) || !strings.Contains(got, "name") {
				t.Fatalf("ValidateName(%q) = %q, want it to contain %q and the field path", tt.name, got, tt.wantErr)
			}
		})
	}
}

func TestParseAssignments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		want    map[corev1.ResourceName]int64
		wantErr []string
	}{
		{"one", []string{"example.com/dongle=4"}, map[corev1.ResourceName]int64{"example.com/dongle": 4}, nil},
		{"several and suffixes", []string{"example.com/a=0", "example.com/b=2k"}, map[corev1.ResourceName]int64{"example.com/a": 0, "example.com/b": 2000}, nil},
		{"none", nil, map[corev1.ResourceName]int64{}, nil},
		{"no equals", []string{"example.com/dongle"}, nil, []string{"args[0]", "must be NAME=QUANTITY"}},
		{"negative", []string{"example.com/dongle=-1"}, nil, []string{"args[0].quantity", "must be 0 or more"}},
		{"fraction", []string{"example.com/dongle=500m"}, nil, []string{"args[0].quantity", "whole number"}},
		{"not a number", []string{"example.com/dongle=four"}, nil, []string{"args[0].quantity", "whole number"}},
		{"duplicate", []string{"example.com/d=1", "example.com/d=2"}, nil, []string{"args[1].name", "Duplicate"}},
		{"every problem at once", []string{"dongle=1", "example.com/x=1.5", "kubernetes.io/y=2"}, nil,
			[]string{"args[0].name", "args[1].quantity", "args[2].name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, errs := ParseAssignments(tt.args, field.NewPath("args"))
			err := errs.ToAggregate()
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("ParseAssignments(%q) = %v, want an error", tt.args, got)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not contain %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for n, v := range tt.want {
				q := got[n]
				if q.Value() != v {
					t.Errorf("%s = %s, want %d", n, q.String(), v)
				}
			}
		})
	}
}

func TestValidateNames(t *testing.T) {
	t.Parallel()
	if errs := ValidateNames([]string{"example.com/a", "example.com/b"}, field.NewPath("--remove")); len(errs) > 0 {
		t.Fatal(errs)
	}
	errs := ValidateNames([]string{"a", "example.com/b", "example.com/b"}, field.NewPath("--remove"))
	err := errs.ToAggregate()
	for _, w := range []string{"--remove[0]", "--remove[2]", "Duplicate"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v does not contain %q", err, w)
		}
	}
}

func FuzzParseAssignments(f *testing.F) {
	for _, s := range []string{"example.com/dongle=4", "a=b", "=", "example.com/x=1e3", "requests.x/y=1", "x/y=-0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, arg string) {
		got, errs := ParseAssignments([]string{arg}, field.NewPath("args"))
		if len(errs) > 0 {
			return
		}
		// Whatever parses is a valid name with a whole, non-negative amount.
		for n, q := range got {
			if errs := ValidateName(string(n), nil); len(errs) > 0 {
				t.Fatalf("%q accepted with invalid name: %v", arg, errs)
			}
			if q.Sign() < 0 || q.MilliValue()%1000 != 0 {
				t.Fatalf("%q accepted with amount %s", arg, q.String())
			}
		}
	})
}
