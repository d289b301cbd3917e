// Package extresource advertises extended resources on Kubernetes nodes.
//
// An extended resource is a domain-qualified name outside kubernetes.io/
// (example.com/dongle) with an integer quantity in a node's status. The
// scheduler counts pods' requests for it against the node's allocatable
// amount; nothing is attached to containers. Advertiser writes the resources
// once with a JSON Patch on the node's status subresource; Controller keeps a
// declared set on a node, restoring it when another writer drops it and
// following changes to its file. See docs/extended-resources.md.
package extresource

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// requestsPrefix is what ResourceQuota puts before a resource name; names
// that start with it are ambiguous in quota and rejected by the apiserver.
const requestsPrefix = "requests."

// ValidateName reports why name is not an extended resource name, with
// fldPath naming where it came from. The rules are the apiserver's: the
// name has a domain prefix (example.com/dongle), the domain is not
// kubernetes.io or one of its subdomains, the name does not start with
// "requests.", and "requests."+name is a qualified name (a DNS subdomain
// prefix, a slash, and at most 63 characters of [A-Za-z0-9_.-] that start
// and end alphanumeric).
func ValidateName(name string, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case name == "":
		return append(errs, field.Required(fldPath, "an extended resource name like example.com/dongle"))
	case !strings.Contains(name, "/"):
		return append(errs, field.Invalid(fldPath, name,
			"must be domain-qualified, like example.com/"+name+"; names without a domain are Kubernetes' own resources (cpu, memory, ...)"))
	case strings.Contains(name, corev1.ResourceDefaultNamespacePrefix):
		return append(errs, field.Invalid(fldPath, name,
			"the kubernetes.io domain and its subdomains are reserved for Kubernetes' own resources; use a domain you own"))
	case strings.HasPrefix(name, requestsPrefix):
		return append(errs, field.Invalid(fldPath, name,
			`must not start with "requests.", which resource quotas put before resource names`))
	}
	if msgs := content.IsLabelKey(name); len(msgs) > 0 {
		for _, m := range msgs {
			errs = append(errs, field.Invalid(fldPath, name, m))
		}
		return errs
	}
	// Quota refers to the resource as requests.<name>: that must be valid
	// too, which makes the domain nine characters shorter than a DNS name.
	if msgs := content.IsLabelKey(requestsPrefix + name); len(msgs) > 0 {
		errs = append(errs, field.Invalid(fldPath, name,
			fmt.Sprintf("must stay a qualified name with the %q prefix quota adds: %s", requestsPrefix, strings.Join(msgs, "; "))))
	}
	return errs
}

// ValidateQuantity reports why q is not a valid extended resource amount:
// extended resources are counted in whole units and cannot be negative.
func ValidateQuantity(q resource.Quantity, fldPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	if q.Sign() < 0 {
		errs = append(errs, field.Invalid(fldPath, q.String(), "must be 0 or more"))
	}
	if q.MilliValue()%1000 != 0 {
		errs = append(errs, field.Invalid(fldPath, q.String(), "must be a whole number: extended resources are counted in units"))
	}
	return errs
}

// ParseAssignments parses NAME=QUANTITY arguments, such as
// "example.com/dongle=4", into a resource list. It reports every invalid or
// repeated argument at once; fldPath names the arguments (their index is
// appended).
func ParseAssignments(args []string, fldPath *field.Path) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	var errs field.ErrorList
	for i, arg := range args {
		p := fldPath.Index(i)
		name, value, ok := strings.Cut(arg, "=")
		if !ok {
			errs = append(errs, field.Invalid(p, arg, "must be NAME=QUANTITY, like example.com/dongle=4"))
			continue
		}
		nameErrs := ValidateName(name, p.Child("name"))
		errs = append(errs, nameErrs...)
		q, err := resource.ParseQuantity(value)
		if err != nil {
			errs = append(errs, field.Invalid(p.Child("quantity"), value, "must be a whole number like 4 (or 2k)"))
			continue
		}
		if qErrs := ValidateQuantity(q, p.Child("quantity")); len(qErrs) > 0 {
			errs = append(errs, qErrs...)
			continue
		}
		if len(nameErrs) > 0 {
			continue
		}
		if _, dup := out[corev1.ResourceName(name)]; dup {
			errs = append(errs, field.Duplicate(p.Child("name"), name))
			continue
		}
		out[corev1.ResourceName(name)] = q
	}
	return out, errs.ToAggregate()
}

// ValidateNames checks names to remove, reporting every problem at once.
func ValidateNames(names []string, fldPath *field.Path) error {
	var errs field.ErrorList
	seen := map[string]bool{}
	for i, n := range names {
		if e := ValidateName(n, fldPath.Index(i)); len(e) > 0 {
			errs = append(errs, e...)
			continue
		}
		if seen[n] {
			errs = append(errs, field.Duplicate(fldPath.Index(i), n))
		}
		seen[n] = true
	}
	return errs.ToAggregate()
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
