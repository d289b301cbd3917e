// Package config reads dpkit's versioned configuration files
// (apiVersion dpkit.io/v1alpha1): strict decoding, defaults, then
// validation that reports every problem at once with its field path.
package config

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// APIVersion is the version of every dpkit configuration file.
const APIVersion = "dpkit.io/v1alpha1"

// TypeMeta identifies a configuration file's schema.
type TypeMeta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
}

// readFile reads path with an error that says what to do when it fails.
func readFile(path, flag string) ([]byte, error) {
	if path == "" {
		return nil, fmt.Errorf("%s is required: give the path of a config file, e.g. %s examples/fake.yaml", flag, flag)
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s %s: the file does not exist", flag, path)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", flag, path, err)
	}
	return data, nil
}

// decodeStrict decodes YAML or JSON into out, refusing unknown fields and
// any apiVersion/kind but the expected ones.
func decodeStrict(data []byte, kind string, out any) error {
	var tm TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return fmt.Errorf("not valid YAML: %w", cleanYAMLError(err))
	}
	var errs []error
	if tm.APIVersion != APIVersion {
		errs = append(errs, fmt.Errorf("apiVersion: %q is not supported; set apiVersion: %s", tm.APIVersion, APIVersion))
	}
	if tm.Kind != kind {
		errs = append(errs, fmt.Errorf("kind: %q is not supported here; set kind: %s", tm.Kind, kind))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := yaml.UnmarshalStrict(data, out); err != nil {
		return cleanYAMLError(err)
	}
	return nil
}

// fieldErrors formats validation errors one per line.
func fieldErrors(errs field.ErrorList) error {
	if len(errs) == 0 {
		return nil
	}
	lines := make([]string, len(errs))
	for i, e := range errs {
		lines[i] = "  - " + e.Error()
	}
	return fmt.Errorf("%d problem(s):\n%s", len(errs), strings.Join(lines, "\n"))
}

// cleanYAMLError drops the decoder's layered prefixes so the message starts
// with what is wrong, e.g. `json: unknown field "cout"` becomes
// `unknown field "cout"`.
func cleanYAMLError(err error) error {
	msg := err.Error()
	for _, p := range []string{"error unmarshaling JSON: ", "while decoding JSON: ", "json: "} {
		msg = strings.ReplaceAll(msg, p, "")
	}
	if strings.HasPrefix(msg, "unknown field") {
		msg += " (check the spelling against the config reference in the README)"
	}
	return errors.New(msg)
}
