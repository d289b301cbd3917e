// Package configfile holds what every dpkit configuration file shares
// (PluginConfig in internal/config, ExtendedResources in pkg/extresource):
// the API version, the TypeMeta that comes first in each type, the
// duration type, and strict decoding. A file's type decodes with
// DecodeStrict, then gets Default() and Validate() field.ErrorList (the
// Object interface), which reports every problem at once with its field
// path.
package configfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
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

// ReadTypeMeta reads the apiVersion and kind of a YAML or JSON document,
// ignoring its other fields.
func ReadTypeMeta(data []byte) (TypeMeta, error) {
	var tm TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return tm, CleanError(err)
	}
	return tm, nil
}

// DecodeStrict decodes a YAML or JSON document into out: unknown and
// duplicate fields are errors, whose messages start with what is wrong.
func DecodeStrict(data []byte, out any) error {
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		return CleanError(err)
	}
	return nil
}

// CleanError drops the decoder's layered prefixes so the message starts
// with what is wrong, e.g. `error unmarshaling JSON: while decoding JSON:
// json: unknown field "cout"` becomes `unknown field "cout"`.
func CleanError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	return errors.New(msg)
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
		return fmt.Errorf("a duration must be a string such as \"5s\" or \"1m30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q is not a duration; use a string such as \"5s\" or \"1m30s\"", s)
	}
	d.Duration = v
	return nil
}
