// Package output writes command results in the formats "-o" selects:
// a human-readable table, JSON or YAML.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Formats accepted by -o.
const (
	Table = "table"
	JSON  = "json"
	YAML  = "yaml"
)

// Check returns an error naming the flag and the accepted formats when
// format is not one of them.
func Check(format string) error {
	switch format {
	case Table, JSON, YAML:
		return nil
	}
	return fmt.Errorf("--output: %q is not a format; use table, json or yaml", format)
}

// Write writes v to w as JSON or YAML, or, for the table format, calls
// table with a tab-aligned writer that it flushes afterwards.
func Write(w io.Writer, format string, v any, table func(*tabwriter.Writer) error) error {
	switch format {
	case JSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case YAML:
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	case Table:
		t := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		if err := table(t); err != nil {
			return err
		}
		return t.Flush()
	}
	return Check(format)
}
