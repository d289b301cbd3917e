package extresource

import (
	"encoding/json"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// Operation is one JSON Patch (RFC 6902) operation.
type Operation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Patch is a JSON Patch document.
type Patch []Operation

// JSON returns the patch as the bytes sent to the apiserver.
func (p Patch) JSON() []byte {
	b, err := json.Marshal(p)
	if err != nil {
		// Operations hold only strings and maps of strings.
		panic("extresource: marshal JSON patch: " + err.Error())
	}
	return b
}

// EscapePointer escapes one JSON Pointer (RFC 6901) reference token: "~"
// becomes "~0" and "/" becomes "~1", so example.com/dongle is addressed as
// /status/capacity/example.com~1dongle.
func EscapePointer(token string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(token)
}

// Change is what a patch does to a node's status.
type Change struct {
	// Set are the resources whose amount the patch writes.
	Set corev1.ResourceList
	// Removed are the resources the patch deletes.
	Removed []corev1.ResourceName
}

// Empty reports whether the change does nothing.
func (c Change) Empty() bool { return len(c.Set) == 0 && len(c.Removed) == 0 }

// Diff returns the JSON Patch that takes node's status to having set in its
// capacity (and in its allocatable when allocatable is true) and none of
// remove in either, and what it changes. Resources already at the wanted
// amount are left alone, so an up-to-date node gives an empty patch. A name
// in both set and remove is set.
func Diff(node *corev1.Node, set corev1.ResourceList, remove []corev1.ResourceName, allocatable bool) (Patch, Change) {
	var patch Patch
	change := Change{Set: corev1.ResourceList{}}
	removed := map[corev1.ResourceName]bool{}
	fields := []struct {
		name  string
		list  corev1.ResourceList
		write bool
	}{
		{"capacity", node.Status.Capacity, true},
		{"allocatable", node.Status.Allocatable, allocatable},
	}
	for _, f := range fields {
		base := "/status/" + f.name
		if f.write {
			var missing corev1.ResourceList
			for _, n := range sortedNames(set) {
				q := set[n]
				if have, ok := f.list[n]; ok && have.Cmp(q) == 0 {
					continue
				}
				change.Set[n] = q
				if len(f.list) == 0 {
					// The map is absent from the stored object: adding a
					// member needs its parent, so add the map whole.
					if missing == nil {
						missing = corev1.ResourceList{}
					}
					missing[n] = q
					continue
				}
				patch = append(patch, Operation{Op: "add", Path: base + "/" + EscapePointer(string(n)), Value: q.String()})
			}
			if missing != nil {
				value := map[string]string{}
				for n, q := range missing {
					value[string(n)] = q.String()
				}
				patch = append(patch, Operation{Op: "add", Path: base, Value: value})
			}
		}
		for _, n := range remove {
			if _, keep := set[n]; keep {
				continue
			}
			if _, ok := f.list[n]; !ok {
				continue
			}
			removed[n] = true
			patch = append(patch, Operation{Op: "remove", Path: base + "/" + EscapePointer(string(n))})
		}
	}
	for n := range removed {
		change.Removed = append(change.Removed, n)
	}
	sort.Slice(change.Removed, func(i, j int) bool { return change.Removed[i] < change.Removed[j] })
	return patch, change
}
