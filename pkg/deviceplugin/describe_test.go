package deviceplugin

import "testing"

func TestFormatAmount(t *testing.T) {
	for v, want := range map[int64]string{0: "0", 7: "7", 80 << 30: "80Gi", 1536: "1536", 1 << 20: "1Mi"} {
		if got := FormatAmount(v); got != want {
			t.Errorf("FormatAmount(%d) = %q, want %q", v, got, want)
		}
	}
}
