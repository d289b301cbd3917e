package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/verify"
)

// fakeDRAConfig is a fake plugin served through the DRA front only; the
// directories, the node and the API server come from what dpkit verify
// --dra sets in the environment.
const fakeDRAConfig = `apiVersion: dpkit.io/v1alpha1
kind: PluginConfig
plugins:
- fake:
    resources:
    - name: verify.dpkit.io/dev
      count: 3
  fronts: [dra]
`

// runVerifyDRA runs dpkit verify --dra -o json on the test control plane
// and returns the report and the exit status.
func runVerifyDRA(t *testing.T, extra []string, command ...string) (*verify.Report, int) {
	t.Helper()
	cp := cluster.Get(t)
	level := "info"
	if testing.Verbose() {
		level = "debug"
	}
	args := append([]string{"--log-level", level, "verify", "--dra", "--kubeconfig", cp.Kubeconfig, "-o", "json"}, extra...)
	args = append(append(args, "--"), command...)
	cmd := exec.Command(dpkitBinary(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var rep verify.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("dpkit %v: exit %d, no JSON report: %v\nstdout:\n%s\nstderr:\n%s", args, code, err, stdout.String(), stderr.String())
	}
	var b bytes.Buffer
	_ = rep.WriteTable(&b)
	t.Logf("dpkit verify --dra (exit %d):\n%s\nstderr:\n%s", code, b.String(), stderr.String())
	return &rep, code
}

// TestVerifyDRAFakePlugin checks that dpkit plugin with the fake plugin
// behind the DRA front passes every check of dpkit verify --dra.
func TestVerifyDRAFakePlugin(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "fake-dra.yaml")
	if err := os.WriteFile(config, []byte(fakeDRAConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, code := runVerifyDRA(t, nil, dpkitBinary(t), "plugin", "--config", config)
	if code != 0 || rep.Failed() {
		t.Fatalf("exit %d, failed checks %v; want none", code, failedChecks(rep))
	}
	if len(rep.Results) != len(verify.DRAChecks()) {
		t.Errorf("%d results, want one per check (%d)", len(rep.Results), len(verify.DRAChecks()))
	}
	for _, r := range rep.Results {
		// The fake plugin's devices do not change during the run.
		if r.Verdict == verify.Skip && !slices.Contains([]string{verify.CheckDRAHealth, verify.CheckDRAGeneration}, r.ID) {
			t.Errorf("%s skipped: %s", r.ID, r.Detail)
		}
	}
}

var (
	brokenDRAOnce sync.Once
	brokenDRAPath string
	brokenDRAErr  error
)

// brokenDRADriver builds the deliberately broken DRA driver
// (internal/testplugins/brokendra) once per test run, beside the dpkit
// binary.
func brokenDRADriver(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(dpkitBinary(t))
	brokenDRAOnce.Do(func() {
		brokenDRAPath = filepath.Join(dir, "brokendra")
		cmd := exec.Command("go", "build", "-o", brokenDRAPath, "./internal/testplugins/brokendra")
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			brokenDRAErr = fmt.Errorf("go build ./internal/testplugins/brokendra: %w\n%s", err, out)
		}
	})
	if brokenDRAErr != nil {
		t.Fatal(brokenDRAErr)
	}
	return brokenDRAPath
}

// brokenDRAFlags are the verify flags of TestVerifyDRABrokenDriver: short
// limits, so that a mode that runs into one is done in seconds.
var brokenDRAFlags = []string{
	"--prepare-timeout", "1s", "--health-timeout", "2s", "--term-timeout", "2s", "--call-timeout", "2s",
	"--reregister-warn", "1s", "--reregister-threshold", "4s",
}

// TestVerifyDRABrokenDriver runs dpkit verify --dra against every mode of
// the broken DRA driver: the mode without a bug passes every check, and
// each other mode gets its check's verdict (a failure, or a warning for a
// slow re-registration) and no failure of any other check.
func TestVerifyDRABrokenDriver(t *testing.T) {
	t.Parallel()
	driver := brokenDRADriver(t)
	cases := []struct {
		mode    string
		args    []string
		check   string
		verdict verify.Verdict
	}{
		{mode: ""},
		{mode: "exit-before-serve", check: verify.CheckDRARegistration},
		{mode: "bad-registration", check: verify.CheckDRARegistration},
		{mode: "register-once", check: verify.CheckDRAKubeletRestart},
		{mode: "slow-reregister", args: []string{"-delay", "1500ms"}, check: verify.CheckDRAKubeletRestart, verdict: verify.Warn},
		{mode: "stale-socket", check: verify.CheckDRADriverRestart},
		{mode: "bad-slices", check: verify.CheckDRASlices},
		{mode: "no-republish", check: verify.CheckDRASlicesRestart},
		{mode: "same-generation", check: verify.CheckDRAGeneration},
		{mode: "drop-result", check: verify.CheckDRAPrepare},
		{mode: "fresh-cdi-ids", check: verify.CheckDRAIdempotent},
		{mode: "whole-call-error", check: verify.CheckDRAPerClaimError},
		{mode: "unprepare-unknown", check: verify.CheckDRAUnknownClaim},
		{mode: "no-cdi-spec", check: verify.CheckDRACDI},
		{mode: "bad-cdi-spec", check: verify.CheckDRACDI},
		{mode: "no-cdi-rewrite", check: verify.CheckDRAReboot},
		{mode: "share-device", check: verify.CheckDRASharedDevice},
		{mode: "slow-prepare", args: []string{"-delay", "3s"}, check: verify.CheckDRATimeout},
		{mode: "health-once", check: verify.CheckDRAHealth},
		{mode: "ignore-sigterm", check: verify.CheckDRAExit},
		{mode: "leave-sockets", check: verify.CheckDRAExit},
	}
	for _, tc := range cases {
		name := tc.mode
		if name == "" {
			name = "no-bug"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			command := append([]string{driver, "-mode", tc.mode, "-health-interval", "500ms"}, tc.args...)
			rep, code := runVerifyDRA(t, brokenDRAFlags, command...)
			if len(rep.Results) != len(verify.DRAChecks()) {
				t.Errorf("%d results, want one per check (%d)", len(rep.Results), len(verify.DRAChecks()))
			}
			if tc.mode == "" {
				if code != 0 || rep.Failed() {
					t.Errorf("exit %d, failed checks %v; want none", code, failedChecks(rep))
				}
				for _, r := range rep.Results {
					if r.Verdict == verify.Skip {
						t.Errorf("%s skipped: %s", r.ID, r.Detail)
					}
				}
				return
			}
			want := tc.verdict
			if want == "" {
				want = verify.Fail
			}
			for _, r := range rep.Results {
				switch {
				case r.ID == tc.check && r.Verdict != want:
					t.Errorf("%s: %s (%s), want %s", r.ID, r.Verdict, r.Detail, want)
				case r.ID != tc.check && r.Verdict == verify.Fail:
					t.Errorf("%s failed too (%s); want only %s to be %s", r.ID, r.Detail, tc.check, want)
				}
			}
			if wantCode := map[bool]int{true: 1, false: 0}[want == verify.Fail]; code != wantCode {
				t.Errorf("exit %d, want %d", code, wantCode)
			}
		})
	}
}

// TestVerifyDRAUpstreamHelper runs dpkit verify --dra against the fake
// DRA driver built on the upstream kubeletplugin helper
// (cmd/dpkit-fakedra): what the helper does (registration,
// stale sockets, ResourceSlices, per-claim errors, health, shutdown)
// passes; the fake driver on top writes no CDI specs and does not keep
// which claim holds a device, and fails exactly those two checks.
func TestVerifyDRAUpstreamHelper(t *testing.T) {
	t.Parallel()
	fakedra := dratest.Binary(t)
	rep, code := runVerifyDRA(t, []string{"--health-timeout", "2s"}, fakedra,
		"--registry-dir", "{registry-dir}", "--kubeconfig", "{kubeconfig}", "--node-name", "{node-name}", "--resend", "500ms")
	want := []string{verify.CheckDRACDI, verify.CheckDRASharedDevice}
	if got := failedChecks(rep); code != 1 || !slices.Equal(got, want) {
		t.Errorf("exit %d, failed checks %v; want exit 1 and %v", code, got, want)
	}
	for _, r := range rep.Results {
		if r.Verdict == verify.Skip && r.ID != verify.CheckDRAReboot && r.ID != verify.CheckDRAGeneration {
			t.Errorf("%s skipped: %s", r.ID, r.Detail)
		}
	}
}
