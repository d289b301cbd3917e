package app

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/advertise"
	"github.com/dpkit/dpkit/internal/cli/node"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/repopath"
)

// contractRow is one row of the command table in docs/cli.md.
type contractRow struct {
	command string   // "up", "get", ...
	kind    string   // "job", "server", or "job, server with `--watch`"
	codes   []string // "0", "1", ...
	formats []string // nil for "—"
}

// readContract parses the command table of docs/cli.md.
func readContract(t *testing.T) map[string]contractRow {
	t.Helper()
	data, err := os.ReadFile(repopath.Find("docs/cli.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]contractRow{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "| `dpkit ") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 4 {
			t.Fatalf("docs/cli.md: row %q has %d cells, want 4", line, len(cells))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		r := contractRow{
			command: strings.TrimSuffix(strings.TrimPrefix(cells[0], "`dpkit "), "`"),
			kind:    cells[1],
			codes:   strings.Split(strings.ReplaceAll(cells[2], " ", ""), ","),
		}
		if cells[3] != "—" {
			r.formats = strings.Split(strings.ReplaceAll(cells[3], " ", ""), ",")
		}
		rows[r.command] = r
	}
	if len(rows) == 0 {
		t.Fatal("docs/cli.md has no command table")
	}
	return rows
}

// fullTree are the options that give the tree dpkit-cluster's node and
// advertise commands in place of the stand-ins, so that every command's
// own contract is checked.
var fullTree = []Option{WithCommands(advertise.NewCommand, node.NewCommand)}

func runContract(ctx context.Context, args ...string) (stdout, stderr string, code int) {
	var out, errOut bytes.Buffer
	err := Run(ctx, args, strings.NewReader(""), &out, &errOut, fullTree...)
	if err != nil {
		errOut.WriteString("error: " + err.Error() + "\n")
	}
	return out.String(), errOut.String(), cli.ExitCode(err)
}

// TestCommandContract holds every command to its row in docs/cli.md: the
// table lists exactly the commands there are, a server is marked as one,
// -o takes exactly the formats listed, and usage errors (an unknown flag,
// a bad format, an unexpected argument) exit 2 before the command does
// anything, naming the problem and pointing to --help.
func TestCommandContract(t *testing.T) {
	t.Parallel()
	rows := readContract(t)
	root := NewRootCommand(&cli.Env{}, fullTree...)
	var names []string
	for _, cmd := range root.Commands() {
		if cmd.Name() == "help" || cmd.Hidden {
			continue
		}
		names = append(names, cmd.Name())
		if _, ok := rows[cmd.Name()]; !ok {
			t.Errorf("docs/cli.md: no row for dpkit %s", cmd.Name())
		}
	}
	for name := range rows {
		if !slices.Contains(names, name) {
			t.Errorf("docs/cli.md: row for dpkit %s, which is not a command", name)
		}
	}

	for _, cmd := range root.Commands() {
		r, ok := rows[cmd.Name()]
		if !ok {
			continue
		}
		t.Run(r.command, func(t *testing.T) {
			t.Parallel()
			checkKind(t, cmd, r)
			checkFormats(t, cmd, r)
			checkUsageErrors(t, cmd, r)
		})
	}
}

func checkKind(t *testing.T, cmd *cobra.Command, r contractRow) {
	t.Helper()
	ann := cmd.Annotations[cli.ServerAnnotation]
	var want string
	switch {
	case r.kind == "job":
	case r.kind == "server":
		want = "true"
	case strings.HasPrefix(r.kind, "job, server with `"):
		want = strings.TrimSuffix(strings.TrimPrefix(r.kind, "job, server with `"), "`")
	default:
		t.Fatalf("docs/cli.md: kind %q is not job, server or \"job, server with `--flag`\"", r.kind)
	}
	if ann != want {
		t.Errorf("server annotation = %q, want %q (kind %q in docs/cli.md)", ann, want, r.kind)
	}
	has130 := slices.Contains(r.codes, "130")
	// version, completion and deviceclass print at once: nothing to interrupt.
	if job := r.kind != "server" && !slices.Contains([]string{"version", "completion", "deviceclass"}, cmd.Name()); job != has130 {
		t.Errorf("docs/cli.md lists exit codes %v: a job that can be interrupted exits 130, a server 0", r.codes)
	}
	if !slices.Contains(r.codes, "2") {
		t.Errorf("docs/cli.md lists exit codes %v: every command has usage errors (2)", r.codes)
	}
}

func checkFormats(t *testing.T, cmd *cobra.Command, r contractRow) {
	t.Helper()
	f := cmd.Flags().Lookup("output")
	if f == nil {
		if r.formats != nil {
			t.Errorf("no -o flag; docs/cli.md lists %v", r.formats)
		}
		return
	}
	fv, ok := f.Value.(*output.Format)
	if !ok {
		t.Fatalf("-o is a %T, not an output.Format (output.AddFlag)", f.Value)
	}
	if got := fv.Formats(); !slices.Equal(got, r.formats) {
		t.Errorf("-o takes %v; docs/cli.md lists %v", got, r.formats)
	}
	if f.Shorthand != "o" {
		t.Errorf("--output has shorthand %q, want o", f.Shorthand)
	}
}

func checkUsageErrors(t *testing.T, cmd *cobra.Command, r contractRow) {
	t.Helper()
	ctx := t.Context()
	help := "See 'dpkit " + r.command + " --help'."
	_, stderr, code := runContract(ctx, r.command, "--no-such-flag")
	if code != cli.ExitUsage || !strings.Contains(stderr, "--no-such-flag") || !strings.Contains(stderr, help) {
		t.Errorf("dpkit %s --no-such-flag: exit %d, stderr %q; want exit 2 naming the flag and %q", r.command, code, stderr, help)
	}
	if r.formats != nil {
		_, stderr, code := runContract(ctx, r.command, "-o", "bogus")
		if code != cli.ExitUsage || !strings.Contains(stderr, strings.Join(r.formats[:len(r.formats)-1], ", ")) {
			t.Errorf("dpkit %s -o bogus: exit %d, stderr %q; want exit 2 listing %v", r.command, code, stderr, r.formats)
		}
	}
	if cmd.Runnable() && cmd.Args != nil && cmd.Args(cmd, []string{"a", "b", "c", "d", "e", "f"}) != nil {
		// Commands whose arguments are not a free-form list reject a
		// surplus of them as a usage error.
		_, stderr, code := runContract(ctx, r.command, "a", "b", "c", "d", "e", "f")
		if code != cli.ExitUsage || !strings.Contains(stderr, "--help") {
			t.Errorf("dpkit %s a b c d e f: exit %d, stderr %q; want exit 2 pointing to --help", r.command, code, stderr)
		}
	}
}

// TestUnknownCommand checks that a mistyped command is a usage error that
// suggests the right one.
func TestUnknownCommand(t *testing.T) {
	t.Parallel()
	_, stderr, code := runContract(t.Context(), "verfy")
	if code != cli.ExitUsage || !strings.Contains(stderr, "verify") {
		t.Errorf("dpkit verfy: exit %d, stderr %q; want exit 2 suggesting verify", code, stderr)
	}
	// A usage error a command finds itself (a wrong argument, a bad flag
	// value) lists the valid values and points to --help too.
	_, stderr, code = runContract(t.Context(), "get", "bogus")
	if code != cli.ExitUsage || !strings.Contains(stderr, "resources, devices, plugins, pods, claims or slices") || !strings.Contains(stderr, "See 'dpkit get --help'.") {
		t.Errorf("dpkit get bogus: exit %d, stderr %q; want exit 2 listing the kinds and pointing to --help", code, stderr)
	}
	_, stderr, code = runContract(t.Context(), "up", "--topology-policy", "bogus")
	if code != cli.ExitUsage || !strings.Contains(stderr, "none, best-effort, restricted or single-numa-node") || !strings.Contains(stderr, "See 'dpkit up --help'.") {
		t.Errorf("dpkit up --topology-policy bogus: exit %d, stderr %q; want exit 2 listing the policies and pointing to --help", code, stderr)
	}
	_, stderr, code = runContract(t.Context(), "--log-level", "loud", "version")
	if code != cli.ExitUsage || !strings.Contains(stderr, "--log-level") {
		t.Errorf("dpkit --log-level loud version: exit %d, stderr %q; want exit 2 naming the flag", code, stderr)
	}
}

// TestInterrupt checks the two ways a signal ends a command: a job that
// had not finished exits 130, a server that stops cleanly exits 0.
func TestInterrupt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	root := t.TempDir()
	_, stderr, code := runContract(ctx, "kubelet", "--root", root)
	if code != 0 {
		t.Errorf("dpkit kubelet stopped by a signal: exit %d, stderr %q; want 0", code, stderr)
	}
	_, stderr, code = runContract(ctx, "get", "resources", "--root", root)
	if code != cli.ExitInterrupted {
		t.Errorf("dpkit get interrupted: exit %d, stderr %q; want 130", code, stderr)
	}
}

// TestLogComponents checks that nested components make one attribute, a
// path, and that the other attributes stay where they were.
func TestLogComponents(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := newLogger(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.With("component", "kubelet", "root", "/r").With("component", "devicemanager").Info("Started", "socket", "s")
	log.Info("Plain")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2: %s", len(lines), buf.String())
	}
	for _, want := range []string{`"root":"/r"`, `"socket":"s"`, `"component":"kubelet/devicemanager"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %s lacks %s", lines[0], want)
		}
	}
	if n := strings.Count(lines[0], `"component"`); n != 1 {
		t.Errorf("line %s has the component key %d times, want once", lines[0], n)
	}
	if strings.Contains(lines[1], "component") {
		t.Errorf("line %s has a component it was not given", lines[1])
	}
}

// TestCleanStopLogs runs dpkit up with JSON logs at debug level until it
// is ready, stops it as Ctrl-C does, and reads every log line: each is
// one JSON object without a repeated key, with the error under "err",
// and a clean stop logs no warning or error.
func TestCleanStopLogs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	var logs bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"up", "--root", t.TempDir(), "--log-format", "json", "--log-level", "debug"}, strings.NewReader(""), pw, &lockedWriter{w: &logs})
		_ = pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "ready:") {
			cancel()
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("dpkit up stopped with %v", err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) < 3 {
		t.Fatalf("only %d log lines at debug level:\n%s", len(lines), logs.String())
	}
	for _, line := range lines {
		keys, err := jsonKeys(line)
		if err != nil {
			t.Errorf("log line %q: %v", line, err)
			continue
		}
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] {
				t.Errorf("log line repeats %q: %s", k, line)
			}
			seen[k] = true
		}
		if seen["error"] {
			t.Errorf("log line carries its error under \"error\", not \"err\": %s", line)
		}
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			t.Errorf("a clean stop logged: %s", line)
		}
	}
}

// jsonKeys returns the top-level keys of a JSON object, repeats included.
func jsonKeys(line string) ([]string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	var keys []string
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, k.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
