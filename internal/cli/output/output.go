// Package output writes command results in the formats "-o" selects:
// a human-readable table, JSON or YAML.
package output

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
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

// Wide is the table format with every column, for commands whose table
// leaves some out.
const Wide = "wide"

// Format is the value of a command's -o flag. It checks the value when
// the flag is parsed, so a bad format is a usage error before the command
// does anything, and it lists the formats for shell completion and for
// the command contract test.
type Format struct {
	value   *string
	formats []string
}

// AddFlag adds "-o, --output" to cmd, stored in p, with the given formats
// (table, json and yaml when none), the first being the default, and
// returns the flag's value.
func AddFlag(cmd *cobra.Command, p *string, formats ...string) *Format {
	if len(formats) == 0 {
		formats = Formats()
	}
	*p = formats[0]
	f := &Format{value: p, formats: formats}
	cmd.Flags().VarP(f, "output", "o", "output format: "+orList(formats))
	_ = cmd.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return f.formats, cobra.ShellCompDirectiveNoFileComp
	})
	return f
}

// String returns the format chosen.
func (f *Format) String() string { return *f.value }

// Set implements pflag.Value.
func (f *Format) Set(s string) error {
	if !slices.Contains(f.formats, s) {
		return fmt.Errorf("%q is not a format; use %s", s, orList(f.formats))
	}
	*f.value = s
	return nil
}

// Type implements pflag.Value.
func (f *Format) Type() string { return "format" }

// Formats returns the formats the flag accepts, the default first.
func (f *Format) Formats() []string { return slices.Clone(f.formats) }

func orList(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// Formats lists the formats -o accepts by default.
func Formats() []string { return []string{Table, JSON, YAML} }
