package verify

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes a readable table: one line per check with its whole
// detail, then what failed or warned with its fix and a link to its
// section in docs/verify.md, the end of the plugin's output when a check
// failed, and the summary line.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.ID, strings.ToUpper(string(res.Verdict)), oneLine(res.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, res := range r.Results {
		if res.Verdict == Fail || res.Verdict == Warn {
			fmt.Fprintf(&b, "\n%s %s: %s\n  %s\n  based on: %s\n", strings.ToUpper(string(res.Verdict)), res.ID, res.Description, res.Detail, res.Basis)
			if res.Fix != "" {
				fmt.Fprintf(&b, "  fix: %s\n  see: %s\n", res.Fix, res.Docs)
			}
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	return r.WriteEnd(w)
}

// WriteEnd writes how a report ends: the last lines of the plugin's output
// when a check failed, and the summary line.
func (r *Report) WriteEnd(w io.Writer) error {
	var b strings.Builder
	if r.PluginOutput != "" {
		fmt.Fprintf(&b, "\nLast output of the plugin:\n%s\n", indent(lastLines(r.PluginOutput, 20)))
	}
	prefix := ""
	if r.Interrupted {
		prefix = "interrupted: "
	}
	fmt.Fprintf(&b, "\n%s%s (%s)\n", prefix, r.Summary, r.Duration.Round(10*time.Millisecond))
	_, err := io.WriteString(w, b.String())
	return err
}

// oneLine keeps a detail on its table line.
func oneLine(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func indent(s string) string { return "  " + strings.ReplaceAll(s, "\n", "\n  ") }

// WriteJSON writes the report as indented JSON (durations in seconds).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
	Output   string      `xml:"system-out,omitempty"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	Output    string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as JUnit XML: one test case per check,
// failed checks as failures, skipped ones as skipped (those an interrupted
// run did not finish with the message "interrupted"); warnings pass with
// their detail in system-out.
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{
		Name: "dpkit verify", Tests: len(r.Results), Failures: r.Summary.Failed, Skipped: r.Summary.Skipped,
		Time: fmt.Sprintf("%.3f", r.Duration.Seconds()), Output: r.PluginOutput,
	}
	for _, res := range r.Results {
		c := junitCase{Name: res.ID, Classname: "dpkit.verify"}
		switch res.Verdict {
		case Fail:
			c.Failure = &junitMessage{Message: res.Detail, Text: res.Description + "\nbased on: " + res.Basis + "\nfix: " + res.Fix + "\nsee: " + res.Docs}
		case Skip:
			c.Skipped = &junitMessage{Message: res.Detail}
		default:
			c.Output = string(res.Verdict) + ": " + res.Detail
		}
		s.Cases = append(s.Cases, c)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}
