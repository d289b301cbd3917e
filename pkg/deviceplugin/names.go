package deviceplugin

import (
	"fmt"
	"strings"

	"github.com/dpkit/dpkit/pkg/resourcename"
)

// ValidateResourceName checks name with the kubelet's rules for extended
// resources served by device plugins: it must be domain-qualified
// ("vendor-domain/name"), the domain must not be kubernetes.io (or a
// subdomain of it), it must not start with "requests.", and "requests."
// followed by the name must be a qualified name.
func ValidateResourceName(name string) error {
	if p := resourcename.Problems(name); len(p) > 0 {
		return fmt.Errorf("resource name %q %s (a valid name: %q)", name, strings.Join(p, "; "), resourcename.Example)
	}
	return nil
}

// socketBase turns a resource name into a string usable in a file name.
func socketBase(name string) string {
	return strings.NewReplacer("/", "_", ".", "_").Replace(name)
}
