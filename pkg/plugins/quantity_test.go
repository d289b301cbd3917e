package plugins

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// TestValidQuantity: the check agrees with resource.ParseQuantity, which
// the DRA front uses to publish capacities (a suffix with no number, which
// it reads as zero, is refused here on purpose).
func TestValidQuantity(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"80Gi", "4", "0", "1.5", ".5", "500m", "2e3", "1E-2", "+3", "-1Ki", "10M", "7n", "1u", "3k", "1Ei", "5.", "", "1GiB", "1 Gi", "1.2.3", "0x10", "1e", "ki", "1K", "abc", "1mi"} {
		_, err := resource.ParseQuantity(s)
		if got, want := ValidQuantity(s), err == nil; got != want {
			t.Errorf("ValidQuantity(%q) = %v, resource.ParseQuantity says %v (%v)", s, got, want, err)
		}
	}
}
