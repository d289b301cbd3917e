package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpkit/dpkit/pkg/verify"
	"github.com/dpkit/dpkit/test/upstream"
)

// TestVerifyUpstreamSamplePlugin runs dpkit verify against the kubelet's
// own sample device plugin. Through kubelet.sock (which it hard-codes, so
// --private-mount, as root) it must fail restart.kubelet: it registers
// again only 10s after kubelet.sock is re-created. That it never registers
// again after its socket is deleted is a warning: the kubelet does not do
// that to a live plugin. Through the plugin watcher it must pass.
func TestVerifyUpstreamSamplePlugin(t *testing.T) {
	bin := upstream.SamplePlugin(t)
	t.Parallel()
	base := verify.Config{
		Command:     []string{bin},
		Restarts:    1,
		QuietPeriod: 300 * time.Millisecond,
		TermTimeout: 5 * time.Second,
	}
	t.Run("kubelet.sock", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("the sample plugin hard-codes /var/lib/kubelet/device-plugins/kubelet.sock: --private-mount needs root")
		}
		t.Parallel()
		cfg := base
		cfg.PrivateMount = true
		rep := runVerify(t, cfg)
		want := []string{verify.CheckKubeletRestart}
		if got := failedChecks(rep); !slices.Equal(got, want) {
			t.Errorf("failed checks %v, want %v", got, want)
		}
		if r := rep.Result(verify.CheckSocketDeleted); r.Verdict != verify.Warn {
			t.Errorf("%s: %s %q, want warn", verify.CheckSocketDeleted, r.Verdict, r.Detail)
		}
		if d := rep.Result(verify.CheckKubeletRestart).Detail; !strings.Contains(d, "above the 5s threshold") && !strings.Contains(d, "did not register again") {
			t.Errorf("%s detail %q does not say it was too slow", verify.CheckKubeletRestart, d)
		}
		var b strings.Builder
		if err := rep.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		for _, line := range []string{"FAIL " + verify.CheckKubeletRestart, "WARN " + verify.CheckSocketDeleted, "1 failed"} {
			if !strings.Contains(b.String(), line) {
				t.Errorf("table lacks %q:\n%s", line, b.String())
			}
		}
	})
	t.Run("plugin watcher", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.PluginWatcher = true
		// The sample plugin's own registration through kubelet.sock is
		// held back by a control file that is never deleted.
		control := filepath.Join(t.TempDir(), "register")
		cfg.Env = append(os.Environ(), upstream.EnvSampleRegisterControlFile+"="+control)
		rep := runVerify(t, cfg)
		if got := failedChecks(rep); len(got) > 0 {
			t.Errorf("want no failed check; failed: %s", failures(rep))
		}
		if r := rep.Result(verify.CheckPluginWatcher); r.Verdict != verify.Pass {
			t.Errorf("%s: %s %q, want pass", verify.CheckPluginWatcher, r.Verdict, r.Detail)
		}
		if !slices.Equal(rep.Resources, []string{upstream.SampleResource}) {
			t.Errorf("resources %v, want [%s]", rep.Resources, upstream.SampleResource)
		}
	})
}

func runVerify(t *testing.T, cfg verify.Config) *verify.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := verify.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	var b strings.Builder
	_ = rep.WriteTable(&b)
	t.Logf("\n%s", b.String())
	return rep
}

func failedChecks(rep *verify.Report) []string {
	var out []string
	for _, r := range rep.Results {
		if r.Verdict == verify.Fail {
			out = append(out, r.ID)
		}
	}
	return out
}

// failures names each failed check with its detail, for a test's failure
// message: the report's table sits in a long log that a summary of the
// run cuts short.
func failures(rep *verify.Report) string {
	var out []string
	for _, r := range rep.Results {
		if r.Verdict == verify.Fail {
			out = append(out, r.ID+": "+r.Detail)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

var (
	brokenOnce sync.Once
	brokenPath string
	brokenErr  error
)

// brokenPlugin builds the deliberately broken test plugin
// (internal/testplugins/broken) once per test run, beside the dpkit
// binary.
func brokenPlugin(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(dpkitBinary(t))
	brokenOnce.Do(func() {
		brokenPath = filepath.Join(dir, "broken")
		cmd := exec.Command("go", "build", "-o", brokenPath, "./internal/testplugins/broken")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			brokenErr = fmt.Errorf("go build ./internal/testplugins/broken: %w\n%s", err, out)
		}
	})
	if brokenErr != nil {
		t.Fatal(brokenErr)
	}
	return brokenPath
}

// TestVerifyPartialUpdates runs the dpkit binary's verify against a plugin
// whose ListAndWatch updates carry only the device that changed: it must
// exit 1 with listandwatch.full-list as the only failure.
func TestVerifyPartialUpdates(t *testing.T) {
	t.Parallel()
	bin, broken := dpkitBinary(t), brokenPlugin(t)
	ctx := testContext(t)
	cmd := exec.CommandContext(ctx, bin, "verify", "-o", "json", "--quiet-period", "300ms", "--restarts", "1", "--health-wait", "20s",
		"--", broken, "-mode", "partial-updates", "-flip-after", "200ms")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("dpkit verify: %v, want exit status 1\n%s\n%s", err, out, stderr.String())
	}
	var rep verify.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("JSON report: %v\n%s", err, out)
	}
	if got := failedChecks(&rep); !slices.Equal(got, []string{verify.CheckFullList}) {
		t.Errorf("failed checks %v, want [%s]\n%s", got, verify.CheckFullList, out)
	}
	if d := rep.Result(verify.CheckFullList).Detail; !strings.Contains(d, "left out 7") || !strings.Contains(d, "the kubelet removes every device a message leaves out") {
		t.Errorf("%s detail %q does not say which devices the update left out", verify.CheckFullList, d)
	}
}

// TestVerifyInterrupted sends SIGINT to a dpkit verify process in the
// middle of its run (while it waits for a health change): it must stop the
// plugin, print "interrupted", exit 130 and write a JUnit file in which
// nothing failed and the unfinished checks are skipped.
func TestVerifyInterrupted(t *testing.T) {
	t.Parallel()
	bin := dpkitBinary(t)
	ctx := testContext(t)
	dir := t.TempDir()
	// A config path of its own, to find the plugin process by.
	config := filepath.Join(dir, "fake.yaml")
	data, err := os.ReadFile(filepath.Join("..", "..", "examples", "fake.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, data, 0o600); err != nil {
		t.Fatal(err)
	}
	junit := filepath.Join(dir, "verify.xml")
	cmd := exec.CommandContext(ctx, bin, "verify", "--log-level", "debug", "--junit", junit, "--health-wait", "10m",
		"--", bin, "plugin", "--config", config, "--plugin-dir", "{plugin-dir}", "--registration", "kubelet")
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The prestart check is decided just before the health check starts
	// its wait.
	var stderr strings.Builder
	sc := bufio.NewScanner(logs)
	found := false
	for !found && sc.Scan() {
		stderr.WriteString(sc.Text() + "\n")
		found = strings.Contains(sc.Text(), "check="+verify.CheckPreStart)
	}
	if !found {
		_ = cmd.Wait()
		t.Fatalf("dpkit verify ended before deciding %s:\n%s\n%s", verify.CheckPreStart, stdout.String(), stderr.String())
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(logs)
	stderr.Write(rest)
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("dpkit verify after SIGINT: %v, want exit status 130\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if !strings.Contains(stderr.String(), "error: interrupted") || !strings.Contains(stdout.String(), "\ninterrupted: ") {
		t.Errorf("dpkit verify did not say it was interrupted:\n%s\n%s", stdout.String(), stderr.String())
	}
	if strings.Contains(stdout.String(), "FAIL") {
		t.Errorf("a check failed after SIGINT:\n%s", stdout.String())
	}
	if pids := processesWith(t, config); len(pids) > 0 {
		t.Errorf("the plugin is still running after verify exited: pids %v", pids)
	}
	data, err = os.ReadFile(junit)
	if err != nil {
		t.Fatal(err)
	}
	var suites struct {
		Suites []struct {
			Failures int `xml:"failures,attr"`
			Skipped  int `xml:"skipped,attr"`
			Cases    []struct {
				Name    string    `xml:"name,attr"`
				Failure *struct{} `xml:"failure"`
				Skipped *struct {
					Message string `xml:"message,attr"`
				} `xml:"skipped"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(data, &suites); err != nil || len(suites.Suites) != 1 {
		t.Fatalf("JUnit: %v\n%s", err, data)
	}
	s := suites.Suites[0]
	if s.Failures != 0 {
		t.Errorf("JUnit has %d failures, want 0\n%s", s.Failures, data)
	}
	interrupted := map[string]bool{}
	for _, c := range s.Cases {
		if c.Failure != nil {
			t.Errorf("JUnit case %s failed", c.Name)
		}
		if c.Skipped != nil && c.Skipped.Message == "interrupted" {
			interrupted[c.Name] = true
		}
	}
	for _, id := range []string{verify.CheckHealth, verify.CheckKubeletRestart, verify.CheckExit} {
		if !interrupted[id] {
			t.Errorf("JUnit case %s is not skipped as interrupted\n%s", id, data)
		}
	}
}

// processesWith returns the IDs of the processes whose command line
// contains s.
func processesWith(t *testing.T, s string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(s)) {
			out = append(out, e.Name())
		}
	}
	return out
}
