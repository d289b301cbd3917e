// Package config reads the PluginConfig file (apiVersion
// dpkit.io/v1alpha1) with the pipeline every dpkit configuration file
// shares (pkg/configfile): TypeMeta checked first, strict decoding that
// reports every unknown field and wrong type with its field path,
// explicit zeros refused, Default, then Validate, which reports every
// problem at once with its field path.
package config

import (
	"errors"
	"fmt"
	"os"
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
