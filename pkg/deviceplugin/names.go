package deviceplugin

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ValidateResourceName checks name with the kubelet's rules for extended
// resources served by device plugins: it must be domain-qualified
// ("vendor-domain/name"), the domain must not be kubernetes.io (or a
// subdomain of it), it must not start with "requests.", and "requests."
// followed by the name must be a qualified name.
func ValidateResourceName(name string) error {
	const example = `use "vendor-domain/name", for example "example.com/foo"`
	switch {
	case name == "":
		return fmt.Errorf("resource name is empty; %s", example)
	case !strings.Contains(name, "/"):
		return fmt.Errorf("resource name %q has no domain; %s", name, example)
	case strings.Contains(name, "kubernetes.io/"):
		return fmt.Errorf("resource name %q uses the kubernetes.io domain, which is reserved for Kubernetes; %s", name, example)
	case strings.HasPrefix(name, "requests."):
		return fmt.Errorf("resource name %q must not start with \"requests.\"; %s", name, example)
	}
	if errs := validation.IsQualifiedName("requests." + name); len(errs) > 0 {
		return fmt.Errorf("resource name %q is not a qualified name: %s; %s", name, strings.Join(errs, "; "), example)
	}
	return nil
}

// socketBase turns a resource name into a string usable in a file name.
func socketBase(name string) string {
	return strings.NewReplacer("/", "_", ".", "_").Replace(name)
}
