package emulator

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/resourcename"
)

// checkContainerResources applies the API server's rules for a
// container's resources (ValidateContainerResourceRequirements in
// k8s.io/kubernetes/pkg/apis/core/validation, v1.37) that matter to
// devices. Without an API server in front of the emulated kubelet, a pod
// breaking them would otherwise be admitted oddly. The rules:
//
//   - a name without a domain is cpu, memory, ephemeral-storage or
//     hugepages-<size>; a name with one is an extended resource name
//     (resourcename), which excludes the requests. prefix;
//   - amounts are not negative, and whole for extended resources;
//   - an extended resource (it cannot be overcommitted) that has a request
//     has a limit, and the two are equal; the API server sets a missing
//     request to the limit, so setting only limits is the way to ask;
//   - a request of another resource is not above its limit.
//
// One name the API server accepts is refused here: a name in the
// kubernetes.io domain that is not one of Kubernetes' own (it counts as
// native there). No device plugin can serve it and no node advertises it,
// so a kubelet rejects the pod at admission; refusing it up front says why.
// Hugepages' own rules (sizes, a cpu or memory request beside them) are
// not checked: no device is involved.
func checkContainerResources(p *field.Path, r corev1.ResourceRequirements) field.ErrorList {
	var errs field.ErrorList
	limits, requests := p.Child("limits"), p.Child("requests")
	for _, name := range sortedResourceNames(r.Limits) {
		errs = append(errs, checkResource(limits.Key(string(name)), name, r.Limits[name])...)
	}
	for _, name := range sortedResourceNames(r.Requests) {
		fp := requests.Key(string(name))
		req := r.Requests[name]
		errs = append(errs, checkResource(fp, name, req)...)
		lim, ok := r.Limits[name]
		switch {
		case ok && overcommitAllowed(name) && req.Cmp(lim) > 0:
			errs = append(errs, field.Invalid(fp, req.String(), fmt.Sprintf("must be less than or equal to %s limit of %s", name, lim.String())))
		case ok && !overcommitAllowed(name) && req.Cmp(lim) != 0:
			errs = append(errs, field.Invalid(fp, req.String(), fmt.Sprintf("must be equal to %s limit of %s; for an extended resource set only limits (the request defaults to the limit)", name, lim.String())))
		case !ok && !overcommitAllowed(name):
			errs = append(errs, field.Required(limits.Key(string(name)), fmt.Sprintf("%s is requested without a limit, and it cannot be overcommitted; set limits: {%s: %s} instead of the request (the request defaults to the limit)", name, name, req.String())))
		}
	}
	return errs
}

// checkResource checks one resource name and amount of a container.
func checkResource(fp *field.Path, name corev1.ResourceName, q resource.Quantity) field.ErrorList {
	var errs field.ErrorList
	n := string(name)
	extended := resourcename.Valid(n)
	switch {
	case extended:
	case len(validation.IsQualifiedName(n)) > 0 && strings.Contains(n, "/"):
		errs = append(errs, field.Invalid(fp, n, "must be an extended resource name: "+strings.Join(resourcename.Problems(n), "; ")))
	case !strings.Contains(n, "/"):
		if !standardContainerResource(name) {
			errs = append(errs, field.Invalid(fp, n, "must be a standard resource for containers (cpu, memory, ephemeral-storage or hugepages-<size>) or an extended resource name with a domain, like example.com/"+n))
		}
	case strings.Contains(n, corev1.ResourceDefaultNamespacePrefix):
		errs = append(errs, field.Invalid(fp, n, "names in the kubernetes.io domain are Kubernetes' own resources: no device plugin serves them and no node advertises this one, so a kubelet rejects the pod; use an extended resource name with a domain you own, like "+resourcename.Example))
	default: // not native, not extended: the requests. prefix
		errs = append(errs, field.Invalid(fp, n, "doesn't follow the extended resource name standard: "+strings.Join(resourcename.Problems(n), "; ")))
	}
	switch {
	case q.Sign() < 0:
		errs = append(errs, field.Invalid(fp, q.String(), "must be greater than or equal to 0"))
	case extended && q.MilliValue()%1000 != 0:
		errs = append(errs, field.Invalid(fp, q.String(), "must be an integer: extended resources are counted in whole devices, such as 1"))
	}
	return errs
}

// checkPodResources applies the API server's rule for pod-level resources
// (spec.resources): only cpu, memory and hugepages-<size>; devices are
// asked for by containers.
func checkPodResources(p *field.Path, r corev1.ResourceRequirements) field.ErrorList {
	var errs field.ErrorList
	for _, kind := range []struct {
		name string
		list corev1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for _, name := range sortedResourceNames(kind.list) {
			if name == corev1.ResourceCPU || name == corev1.ResourceMemory || strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) {
				continue
			}
			fe := field.NotSupported(p.Child(kind.name).Key(string(name)), name, []string{"cpu", "memory", "hugepages-<size>"})
			if resourcename.Valid(string(name)) {
				fe.Detail += "; ask for devices in each container's resources.limits"
			}
			errs = append(errs, fe)
		}
	}
	return errs
}

// overcommitAllowed reports whether a request of name may be below its
// limit: the API server allows it for Kubernetes' own resources (no
// domain, or the kubernetes.io domain) except hugepages.
func overcommitAllowed(name corev1.ResourceName) bool {
	n := string(name)
	native := !strings.Contains(n, "/") || strings.Contains(n, corev1.ResourceDefaultNamespacePrefix)
	return native && !strings.HasPrefix(n, corev1.ResourceHugePagesPrefix)
}

// standardContainerResource reports whether name is one of the resources a
// container may ask for besides extended resources, as the API server
// accepts them.
func standardContainerResource(name corev1.ResourceName) bool {
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
		return true
	}
	return strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix)
}

func sortedResourceNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// unserved returns a warning for each resource a container of pod asks
// for that is neither a standard container resource nor one the device
// manager knows (served lists those). The kubelet admits such a pod: its
// device manager skips resources no plugin ever registered, and its
// resource fit check drops extended resources the node does not advertise
// (removeMissingExtendedResources), leaving them to a scheduler that would
// not have placed the pod there. A typo in a resource name passes
// silently on a node; here it is said.
func unserved(pod *corev1.Pod, served []devicehost.ResourceStatus) []string {
	known := make(map[corev1.ResourceName]bool, len(served))
	names := make([]string, 0, len(served))
	for _, r := range served {
		known[corev1.ResourceName(r.Name)] = true
		names = append(names, r.Name)
	}
	list := "none"
	if len(names) > 0 {
		list = strings.Join(names, ", ")
	}
	var out []string
	spec := field.NewPath("spec")
	check := func(p *field.Path, cs []corev1.Container) {
		for i, c := range cs {
			res := p.Index(i).Child("resources")
			for _, kind := range []struct {
				name string
				list corev1.ResourceList
			}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
				for _, name := range sortedResourceNames(kind.list) {
					if _, inLimits := c.Resources.Limits[name]; kind.name == "requests" && inLimits {
						continue // said for the limit
					}
					if standardContainerResource(name) || known[name] {
						continue
					}
					out = append(out, fmt.Sprintf("%s: no device plugin serves %s, so the pod was admitted without devices for it, as a kubelet admits it; resources served: %s",
						res.Child(kind.name).Key(string(name)), name, list))
				}
			}
		}
	}
	check(spec.Child("initContainers"), pod.Spec.InitContainers)
	check(spec.Child("containers"), pod.Spec.Containers)
	return out
}
