package podruntime

import "testing"

func TestExpand(t *testing.T) {
	t.Parallel()
	env := map[string]string{"A": "x", "B": "y"}
	for in, want := range map[string]string{
		"$(A)-$(B)": "x-y",
		"$$(A)":     "$(A)",
		"$(C)":      "$(C)",
		"plain":     "plain",
		"$(A":       "$(A",
		"$":         "$",
	} {
		if got := Expand(in, env); got != want {
			t.Errorf("Expand(%q) = %q, want %q", in, got, want)
		}
	}
}
