package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

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
		if r.Verdict == verify.Skip && !slices.Contains([]string{verify.CheckDRAHealth}, r.ID) {
			t.Errorf("%s skipped: %s", r.ID, r.Detail)
		}
	}
}
