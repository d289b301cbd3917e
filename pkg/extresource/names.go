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
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/resourcename"
)

// ValidateName reports why name is not an extended resource name, with
// fldPath naming where it came from. The rules are the apiserver's and the
// kubelet's (package resourcename).
func ValidateName(name string, fldPath *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(fldPath, "an extended resource name like example.com/dongle")}
	}
	var errs field.ErrorList
	for _, m := range resourcename.Problems(name) {
		errs = append(errs, field.Invalid(fldPath, name, m))
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
// appended). What parses is returned even when other arguments do not.
func ParseAssignments(args []string, fldPath *field.Path) (corev1.ResourceList, field.ErrorList) {
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
	return out, errs
}

// ValidateNames checks names to remove, reporting every problem at once.
func ValidateNames(names []string, fldPath *field.Path) field.ErrorList {
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
	return errs
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
