// Package configfile holds what every dpkit configuration file shares
// (PluginConfig in internal/config, ExtendedResources in pkg/extresource):
// the API version, the TypeMeta that comes first in each type, the
// duration type, the layout of a list of problems, and the one pipeline a
// file goes through, Decode:
//
//  1. apiVersion and kind are checked before anything else, with the same
//     wording for every file type;
//  2. the document is decoded strictly: an unknown field (a misspelling, a
//     wrong case), a value of the wrong type or a field given twice is a
//     problem with its field path and, for a field name, the closest known
//     one; every such problem is reported at once;
//  3. a field given an explicit zero ("count: 0", "rescanInterval: 0s",
//     `idPattern: ""`) that Default would replace is a problem: the file
//     says something its author did not mean;
//  4. Default, then Validate, which reports every remaining problem with
//     its field path.
package configfile

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// APIVersion is the version of every dpkit configuration file.
const APIVersion = "dpkit.io/v1alpha1"

// TypeMeta identifies a configuration file's schema. Each file type
// embeds it first, inline.
type TypeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// Object is a configuration file's type.
type Object interface {
	// Default fills in what the file left out.
	Default()
	// Validate reports every problem, each with its field path. Call
	// Default first.
	Validate() field.ErrorList
}

// Problems is every problem found in one input (a configuration file, a
// command line), each with its field path. Its message is the layout
// every dpkit command prints a list of problems in:
//
//	2 problem(s):
//	  - plugins[0].fake.resourcename: Not found: unknown field; did you mean "resourceName"? (field names are case-sensitive)
//	  - registration: Unsupported value: "sometimes": supported values: "auto", "kubelet", "registry"
type Problems field.ErrorList

// Join returns errs as Problems, or nil when there are none.
func Join(errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	return Problems(errs)
}

func (p Problems) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d problem(s):", len(p))
	for _, e := range p {
		b.WriteString("\n  - ")
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap returns each problem as an error.
func (p Problems) Unwrap() []error {
	out := make([]error, len(p))
	for i, e := range p {
		out[i] = e
	}
	return out
}

// Duration is a time.Duration written in configuration files as a string
// such as "5s" or "1m30s". It is used instead of apimachinery's
// metav1.Duration to keep the plugin binary free of the Kubernetes object
// machinery.
type Duration struct {
	time.Duration
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(d.String())
}

// UnmarshalJSON reads a string such as "5s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("must be a duration written as a string such as \"5s\" or \"1m30s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration; use a string such as \"5s\" or \"1m30s\"", s)
	}
	d.Duration = v
	return nil
}
