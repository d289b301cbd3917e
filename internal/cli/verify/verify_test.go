package verify_test

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/cli"
	verifycmd "github.com/dpkit/dpkit/internal/cli/verify"
	"github.com/dpkit/dpkit/pkg/verify"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runCtx(context.Background(), t, args...)
}

func runCtx(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	env := &cli.Env{Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler)}
	cmd := verifycmd.NewCommand(env)
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(ctx)
	return out.String(), err
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "COMMAND: give the plugin command (dpkit verify -- my-plugin ...) or the directory of a running plugin (--socket-dir)"},
		{"no dash", []string{"my-plugin"}, "put the plugin command after --, e.g. dpkit verify -- ./myplugin"},
		{"both", []string{"--socket-dir", "/run/dp"}, "--socket-dir: Invalid value: \"/run/dp\": give either a command to run or --socket-dir of a running plugin, not both"},
		{"no restarts", []string{"--restarts", "0"}, "--restarts: 0: give 1 or more (default 3); the restart checks need at least one kubelet restart"},
		{"zero timeout", []string{"--register-timeout", "0s"}, "--register-timeout: 0s: must be above 0 (default 10s)"},
		{"negative health wait", []string{"--health-wait", "-1s"}, "--health-wait: -1s: must not be negative"},
		{"junit in a missing directory", []string{"--junit", "/nonexistent/reports/verify.xml"},
			"--junit: directory /nonexistent/reports does not exist; create it first (mkdir -p /nonexistent/reports) or give a path in an existing directory"},
		{"junit is a directory", []string{"--junit", "/"}, "--junit: / is a directory; give a file path, e.g. /verify.xml"},
		{"several", []string{"--restarts", "0", "--health-wait", "-1s"}, "2 problem(s):\n  - --health-wait: -1s: must not be negative"},
		{"a device plugin flag with --dra", []string{"--dra", "--restarts", "2"}, "--restarts: applies to device plugins only; leave it out with --dra"},
		{"a DRA flag without --dra", []string{"--prepare-timeout", "1s"}, "--prepare-timeout: applies with --dra only; add --dra to verify a DRA driver"},
		{"--dra with no prepare time", []string{"--dra", "--prepare-timeout", "0s"}, "--prepare-timeout: 0s: must be above 0 (default 45s, the kubelet's)"},
		{"--rbac without --dra", []string{"--rbac", "rbac.yaml"}, "--rbac: applies with --dra only; add --dra to verify a DRA driver"},
		{"--cleanup without --dra", []string{"--cleanup"}, "--cleanup: applies with --dra only; add --dra to verify a DRA driver"},
		{"--cleanup with a command", []string{"--dra", "--cleanup"}, "COMMAND: --cleanup runs no driver; leave out touch"},
		{"--cleanup with a run's flag", []string{"--dra", "--cleanup", "--rbac", "rbac.yaml", "--restarts", "2"},
			"3 problem(s):\n  - --restarts: applies to a run; leave it out with --cleanup\n  - --rbac: applies to a run; leave it out with --cleanup"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The plugin command, when there is one, leaves a mark: a
			// usage error is reported before anything runs.
			mark := filepath.Join(t.TempDir(), "ran")
			args := tt.args
			if tt.name != "no command" && tt.name != "no dash" {
				args = append(append([]string(nil), args...), "--", "touch", mark)
			}
			_, err := run(t, args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if code := cli.ExitCode(err); code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if _, err := os.Stat(mark); err == nil {
				t.Errorf("the plugin command ran despite the usage error")
			}
		})
	}
}

// A plugin that exits at once fails the registration checks: exit code 1,
// JSON and JUnit outputs name them.
func TestFailingPluginOutputs(t *testing.T) {
	t.Parallel()
	junit := filepath.Join(t.TempDir(), "verify.xml")
	out, err := run(t, "-o", "json", "--junit", junit, "--", "sh", "-c", "echo plugin says bye; exit 3")
	if code := cli.ExitCode(err); code != 1 {
		t.Fatalf("exit code %d (%v), want 1", code, err)
	}
	var rep verify.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, out)
	}
	if rep.Summary.Failed == 0 || rep.Result(verify.CheckServing).Verdict != verify.Fail {
		t.Errorf("report %+v: want %s failed", rep.Summary, verify.CheckServing)
	}
	if r := rep.Result(verify.CheckServing); r.Fix == "" || !strings.HasPrefix(r.Docs, verify.DocsURL+"#") {
		t.Errorf("%s in JSON has no fix or link: %+v", verify.CheckServing, r)
	}
	if !strings.Contains(out, `"duration": 0.`) {
		t.Errorf("JSON duration is not in seconds:\n%s", out)
	}
	if !strings.Contains(rep.PluginOutput, "plugin says bye") {
		t.Errorf("pluginOutput %q lacks the plugin's output", rep.PluginOutput)
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suites struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &suites); err != nil {
		t.Fatalf("JUnit: %v\n%s", err, data)
	}
	if len(suites.Suites) != 1 || suites.Suites[0].Tests != len(verify.Checks()) || suites.Suites[0].Failures != rep.Summary.Failed {
		t.Fatalf("JUnit suites %+v, want one suite of %d tests with %d failures", suites.Suites, len(verify.Checks()), rep.Summary.Failed)
	}
	for _, c := range suites.Suites[0].Cases {
		if c.Name == verify.CheckServing && c.Failure == nil {
			t.Errorf("JUnit case %s has no failure", c.Name)
		}
	}
}

// Piped, the table comes at the end with every detail whole (the one of
// registration.serving here is over 200 characters) and no colour, and
// each failure has its fix and the link to its section of docs/verify.md.
func TestTableOutput(t *testing.T) {
	t.Parallel()
	out, err := run(t, "--register-timeout", "1s", "--", "sleep", "60")
	if cli.ExitCode(err) != 1 {
		t.Fatalf("exit code %d (%v), want 1", cli.ExitCode(err), err)
	}
	serving := verify.Checks()[0]
	detail := "no Register call arrived: none within 1s; the plugin listens on no unix socket. Fix: serve the device plugin API on a socket in the directory verify hands down ({plugin-dir} in its arguments or $DPKIT_PLUGIN_DIR), then register"
	for _, want := range []string{"CHECK", "RESULT", "\n" + serving.ID + " ", " FAIL    " + detail + "\n", "FAIL " + serving.ID + ": " + serving.Description,
		"  fix: " + serving.Fix + "\n", "  see: " + serving.DocsURL() + "\n", " 1 failed, "} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") || strings.Contains(out, "...") {
		t.Errorf("piped table has colour or a cut detail:\n%s", out)
	}
}

// -o yaml: the report with the duration in seconds and the failed check's
// fix and link.
func TestYAMLOutput(t *testing.T) {
	t.Parallel()
	out, err := run(t, "-o", "yaml", "--", "sh", "-c", "exit 3")
	if code := cli.ExitCode(err); code != 1 {
		t.Fatalf("exit code %d (%v), want 1", code, err)
	}
	var raw struct {
		Duration any `json:"duration"`
		Results  []struct {
			ID, Verdict, Fix, Docs string
		} `json:"results"`
	}
	if err := yaml.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("YAML output: %v\n%s", err, out)
	}
	if _, ok := raw.Duration.(float64); !ok || !strings.Contains(out, "\nduration: 0.") {
		t.Errorf("duration %#v, want seconds (a number below 1 here)\n%s", raw.Duration, out)
	}
	serving := verify.Checks()[0]
	if r := raw.Results[0]; r.ID != serving.ID || r.Verdict != "fail" || r.Fix != serving.Fix || r.Docs != serving.DocsURL() {
		t.Errorf("first result %+v, want %s failed with its fix and link", r, serving.ID)
	}
}

// A plugin that exits with status 0 before registering: one failure that
// says so, without "<nil>".
func TestPluginExitsAtStart(t *testing.T) {
	t.Parallel()
	out, err := run(t, "--", "true")
	if code := cli.ExitCode(err); code != 1 {
		t.Fatalf("exit code %d (%v), want 1", code, err)
	}
	for _, want := range []string{"FAIL " + verify.CheckServing, "the plugin exited with status 0 before registering", "0 passed, 1 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "<nil>") {
		t.Errorf("table says <nil>:\n%s", out)
	}
}

// junitReport is the part of the JUnit XML the tests read.
type junitReport struct {
	Suites []struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Skipped  int `xml:"skipped,attr"`
		Cases    []struct {
			Name    string `xml:"name,attr"`
			Failure *struct {
				Message string `xml:"message,attr"`
			} `xml:"failure"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// An interrupted run (its context ends, as on Ctrl-C) exits 130, says
// "interrupted", and its JUnit has no failure: every unfinished check is
// skipped. The plugin tells the test through a FIFO that it has started,
// so the run is interrupted while it waits for the registration.
func TestInterrupted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "started")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(dir, "verify.xml")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := runCtx(ctx, t, "--junit", junit, "--register-timeout", "1m", "--", "sh", "-c", "echo up > "+fifo+"; exec sleep 60")
		done <- result{out, err}
	}()
	f, err := os.Open(fifo) // blocks until the plugin opens it to write
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(f); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	cancel()
	var res result
	select {
	case res = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("verify did not return within 30s of being interrupted")
	}
	if code := cli.ExitCode(res.err); code != cli.ExitInterrupted || res.err.Error() != "interrupted" {
		t.Errorf("exit code %d (%v), want %d and \"interrupted\"", code, res.err, cli.ExitInterrupted)
	}
	if !strings.Contains(res.out, "interrupted: 0 passed, 0 failed") || strings.Contains(res.out, "FAIL") {
		t.Errorf("table does not say interrupted without failures:\n%s", res.out)
	}
	data, err := os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var rep junitReport
	if err := xml.Unmarshal(data, &rep); err != nil {
		t.Fatalf("JUnit: %v\n%s", err, data)
	}
	if len(rep.Suites) != 1 || rep.Suites[0].Failures != 0 || rep.Suites[0].Skipped != len(verify.Checks()) {
		t.Fatalf("JUnit suites %+v, want one suite with 0 failures and %d skipped", rep.Suites, len(verify.Checks()))
	}
	for _, c := range rep.Suites[0].Cases {
		if c.Failure != nil || c.Skipped == nil || c.Skipped.Message != "interrupted" {
			t.Errorf("JUnit case %s: failure %v, skipped %v; want skipped as interrupted", c.Name, c.Failure, c.Skipped)
		}
	}
}

// fakeCluster answers dpkit verify --dra --cleanup with a report.
type fakeCluster struct {
	cli.Cluster
	rep        *verify.DRACleanupReport
	kubeconfig string
	cfg        verify.DRACleanupConfig
}

func (f *fakeCluster) VerifyDRA(context.Context, string, verify.DRAConfig) (*verify.Report, error) {
	return nil, errors.New("not this")
}

func (f *fakeCluster) CleanupDRA(_ context.Context, kubeconfig string, cfg verify.DRACleanupConfig) (*verify.DRACleanupReport, error) {
	f.kubeconfig, f.cfg = kubeconfig, cfg
	return f.rep, nil
}

// TestCleanupOutput: dpkit verify --dra --cleanup lists what it found and
// did, and exits 1 when something of a run that ended is left.
func TestCleanupOutput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		rep  verify.DRACleanupReport
		args []string
		want []string
		code int
	}{
		{"nothing", verify.DRACleanupReport{}, nil, []string{"Nothing to clean up"}, 0},
		{"removed and kept", verify.DRACleanupReport{Leftovers: []verify.DRALeftover{
			{Run: "x7k2qp", Object: "Node dpkit-verify-x7k2qp", Action: verify.LeftoverRemoved},
			{Run: "b4c5dd", Object: "directory /tmp/dpvd1", Action: verify.LeftoverKept, Detail: "its run goes on (pid 42 on h)"},
		}}, []string{"--kubeconfig", "k.conf", "--call-timeout", "3s"}, []string{
			"RUN     OBJECT                    ACTION   DETAIL",
			"x7k2qp  Node dpkit-verify-x7k2qp  removed",
			"b4c5dd  directory /tmp/dpvd1      kept     its run goes on (pid 42 on h)",
		}, 0},
		{"failed", verify.DRACleanupReport{Leftovers: []verify.DRALeftover{
			{Run: "x7k2qp", Object: "Namespace dpkit-verify-x7k2qp", Action: verify.LeftoverFailed, Detail: "forbidden"},
		}}, []string{"-o", "json"}, []string{`"action": "failed"`}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			fc := &fakeCluster{rep: &tc.rep}
			env := &cli.Env{Out: &out, Err: io.Discard, Logger: slog.New(slog.DiscardHandler), Cluster: fc}
			cmd := verifycmd.NewCommand(env)
			cmd.SetArgs(append([]string{"--dra", "--cleanup"}, tc.args...))
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.ExecuteContext(context.Background())
			if code := cli.ExitCode(err); code != tc.code {
				t.Errorf("exit %d (%v), want %d", code, err, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output:\n%s\nwant it to contain %q", out.String(), w)
				}
			}
			if tc.name == "removed and kept" && (fc.kubeconfig != "k.conf" || fc.cfg.CallTimeout != 3*time.Second) {
				t.Errorf("cleanup kubeconfig %q, configuration %+v, want --kubeconfig and --call-timeout", fc.kubeconfig, fc.cfg)
			}
		})
	}
}
