// Package resourcename checks extended resource names: the names device
// plugins register with the kubelet and that nodes advertise in their
// status. The kubelet (for device plugins) and the apiserver (for node
// status and quota) apply the same rule; dpkit checks it in one place.
// It also derives the DRA names of a resource: its driver and its
// devices.
package resourcename

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
)

// requestsPrefix is what ResourceQuota puts before a resource name.
const requestsPrefix = "requests."

// Example is a valid name to show in error messages.
const Example = "example.com/foo"

// Problems returns why name is not an extended resource name, or nothing
// when it is one. The rule: the name has a domain prefix
// (example.com/dongle), the domain is not kubernetes.io or one of its
// subdomains, the name does not start with "requests.", and both the name
// and "requests."+name are qualified names (a DNS subdomain prefix, a
// slash, and at most 63 characters of [A-Za-z0-9_.-] that start and end
// alphanumeric).
func Problems(name string) []string {
	switch {
	case name == "":
		return []string{"is empty; use a domain-qualified name like " + Example}
	case !strings.Contains(name, "/"):
		return []string{"must be domain-qualified, like example.com/" + name + "; names without a domain are Kubernetes' own resources (cpu, memory, ...)"}
	case strings.Contains(name, "kubernetes.io/"):
		return []string{"the kubernetes.io domain and its subdomains are reserved for Kubernetes' own resources; use a domain you own, like " + Example}
	case strings.HasPrefix(name, requestsPrefix):
		return []string{`must not start with "requests.", which resource quotas put before resource names`}
	}
	if msgs := content.IsLabelKey(name); len(msgs) > 0 {
		return msgs
	}
	// Quota refers to the resource as requests.<name>: that must be valid
	// too, which makes the domain nine characters shorter than a DNS name.
	if msgs := content.IsLabelKey(requestsPrefix + name); len(msgs) > 0 {
		return []string{fmt.Sprintf("must stay a qualified name with the %q prefix quota adds: %s", requestsPrefix, strings.Join(msgs, "; "))}
	}
	return nil
}

// Valid reports whether name is an extended resource name.
func Valid(name string) bool { return len(Problems(name)) == 0 }

// DriverName returns the default DRA driver name for the extended
// resource name: "class.vendor.com" for "vendor.com/class" (nvidia.com/gpu
// becomes gpu.nvidia.com, example.com/foo becomes foo.example.com), the
// class lower-cased and made a DNS label: every character other than a-z,
// 0-9 and "-" becomes "-", and leading or trailing "-" are dropped. A name
// without a domain is returned lower-cased, as is. The result is not
// checked: a driver name must also be a DNS subdomain of at most 63
// characters, which a long domain can exceed.
func DriverName(resource string) string {
	domain, class, ok := strings.Cut(resource, "/")
	if !ok {
		return strings.ToLower(resource)
	}
	label := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return '-'
	}, class)
	label = strings.Trim(label, "-")
	if len(label) > 63 {
		label = strings.TrimRight(label[:63], "-")
	}
	domain = strings.ToLower(domain)
	if label == "" {
		return domain
	}
	return label + "." + domain
}

// DRADeviceName returns the ResourceSlice device name of a device ID: a DNS
// label derived from it. Lowercase letters and digits are kept, uppercase
// letters are lowered and every run of other characters becomes one '-',
// with '-' trimmed from both ends. When that changed the ID, or left it
// empty or longer than 63 characters, a '-' and the first 10 hex digits of
// the ID's SHA-256 are appended (the name cut to fit), so two IDs that
// clean up the same still get different names. The same ID always gets
// the same name.
func DRADeviceName(id string) string {
	var b strings.Builder
	dash := false
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
			dash = false
		case r >= 'A' && r <= 'Z':
			b.WriteRune(r - 'A' + 'a')
			dash = false
		default:
			if !dash {
				b.WriteByte('-')
				dash = true
			}
		}
	}
	name := strings.Trim(b.String(), "-")
	if name == id && len(name) <= 63 && name != "" {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	suffix := hex.EncodeToString(sum[:5])
	const keep = 63 - 1 - 10
	if len(name) > keep {
		name = strings.TrimRight(name[:keep], "-")
	}
	if name == "" {
		return "d-" + suffix
	}
	return name + "-" + suffix
}
