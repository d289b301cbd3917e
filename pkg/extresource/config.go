package extresource

import (
	"errors"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/configfile"
)

// Kind identifies a resources file; its apiVersion is
// configfile.APIVersion.
const Kind = "ExtendedResources"

// DefaultResyncPeriod is how often a controller re-checks its node when no
// event arrives.
const DefaultResyncPeriod = 10 * time.Minute

// ExtendedResources is the resources file:
//
//	apiVersion: dpkit.io/v1alpha1
//	kind: ExtendedResources
//	resources:
//	- name: example.com/dongle
//	  quantity: 4
type ExtendedResources struct {
	configfile.TypeMeta `json:",inline"`
	// Resources to advertise on the node.
	Resources []Resource `json:"resources"`
	// Allocatable also writes status.allocatable. Defaults to true.
	Allocatable *bool `json:"allocatable,omitempty"`
	// ResyncPeriod is how often the controller re-checks the node without
	// an event. Defaults to 10m; 0s turns it off.
	ResyncPeriod *configfile.Duration `json:"resyncPeriod,omitempty"`
}

// Resource is one extended resource and its amount.
type Resource struct {
	// Name is domain-qualified, like example.com/dongle.
	Name corev1.ResourceName `json:"name"`
	// Quantity is a whole number, 0 or more. Defaults to 1.
	Quantity *resource.Quantity `json:"quantity,omitempty"`
}

// Decode decodes, defaults and validates a resources file with the
// pipeline every dpkit configuration file goes through (configfile.Decode):
// apiVersion and kind first, then every unknown field, wrong type and
// explicit zero, then every invalid value, each with its field path.
// Problems in the content come as configfile.Problems.
func Decode(data []byte) (*ExtendedResources, error) {
	var er ExtendedResources
	if err := configfile.Decode(data, Kind, &er); err != nil {
		return nil, err
	}
	return &er, nil
}

// Load reads and decodes a resources file; its errors start with the
// file's path.
func Load(path string) (*ExtendedResources, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: the file does not exist", path)
	}
	if err != nil {
		return nil, err
	}
	er, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s:\n%w", path, err)
	}
	return er, nil
}

// Default fills in what the file left out.
func (er *ExtendedResources) Default() {
	if er.Allocatable == nil {
		t := true
		er.Allocatable = &t
	}
	if er.ResyncPeriod == nil {
		er.ResyncPeriod = &configfile.Duration{Duration: DefaultResyncPeriod}
	}
	for i := range er.Resources {
		if er.Resources[i].Quantity == nil {
			q := resource.MustParse("1")
			er.Resources[i].Quantity = &q
		}
	}
}

// Validate reports every problem in the file at once, each with its field
// path. Call Default first: a missing quantity is an error here. apiVersion
// and kind are Decode's to check: a value built in code need not set them.
func (er *ExtendedResources) Validate() field.ErrorList {
	var errs field.ErrorList
	if er.ResyncPeriod != nil && er.ResyncPeriod.Duration < 0 {
		errs = append(errs, field.Invalid(field.NewPath("resyncPeriod"), er.ResyncPeriod.String(), "must be 0s (off) or more"))
	}
	seen := map[corev1.ResourceName]bool{}
	for i, r := range er.Resources {
		p := field.NewPath("resources").Index(i)
		errs = append(errs, ValidateName(string(r.Name), p.Child("name"))...)
		if r.Quantity == nil {
			errs = append(errs, field.Required(p.Child("quantity"), "a whole number, 0 or more"))
		} else {
			errs = append(errs, ValidateQuantity(*r.Quantity, p.Child("quantity"))...)
		}
		if r.Name != "" && seen[r.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), string(r.Name)))
		}
		seen[r.Name] = true
	}
	return errs
}

// List returns the resources as a resource list.
func (er *ExtendedResources) List() corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, r := range er.Resources {
		if r.Quantity != nil {
			out[r.Name] = *r.Quantity
		}
	}
	return out
}
