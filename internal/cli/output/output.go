// Package output writes command results in the formats "-o" selects:
// a human-readable table, JSON or YAML.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

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

// ID returns a device ID as a table cell shows it: unchanged when it is
// plain, quoted with strconv.Quote when it has a character that would
// garble the table or make the ID look like something else: a control or
// other non-printing character (a newline, an escape sequence), invalid
// UTF-8, a space, a path separator, a comma (the separator of ID lists) or
// a double quote. An empty ID is shown as "". The kubelet takes device IDs
// from plugins as opaque strings; JSON and YAML output keep them as they are.
func ID(id string) string {
	if id == "" || !utf8.ValidString(id) || strings.IndexFunc(id, needsQuote) >= 0 {
		return strconv.Quote(id)
	}
	return id
}

// IDs returns ids as a table cell shows them: each as ID does, joined with
// commas.
func IDs(ids []string) string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = ID(id)
	}
	return strings.Join(out, ",")
}

func needsQuote(r rune) bool {
	switch r {
	case ' ', '/', '\\', ',', '"':
		return true
	}
	return !unicode.IsPrint(r)
}
