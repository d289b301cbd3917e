// Package config reads the PluginConfig file (apiVersion
// dpkit.io/v1alpha1) with the pipeline every dpkit configuration file
// shares (pkg/configfile): TypeMeta checked first, strict decoding,
// Default, then Validate, which reports every problem at once with its
// field path.
package config

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/pkg/configfile"
)

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
	tm, err := configfile.ReadTypeMeta(data)
	if err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	var errs []error
	if tm.APIVersion != configfile.APIVersion {
		errs = append(errs, fmt.Errorf("apiVersion: %q is not supported; set apiVersion: %s", tm.APIVersion, configfile.APIVersion))
	}
	if tm.Kind != kind {
		errs = append(errs, fmt.Errorf("kind: %q is not supported here; set kind: %s", tm.Kind, kind))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := configfile.DecodeStrict(data, out); err != nil {
		return withHint(err)
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

// withHint points an unknown field at the config reference.
func withHint(err error) error {
	if strings.HasPrefix(err.Error(), "unknown field") {
		return fmt.Errorf("%w (check the spelling against the config reference in the README)", err)
	}
	return err
}
