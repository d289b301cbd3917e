package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/verify"
	"github.com/dpkit/dpkit/test/controlplane"
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
	level := "info"
	if testing.Verbose() {
		level = "debug"
	}
	rep, code, _ := verifyDRA(t, cluster.Get(t).Kubeconfig, []string{"--log-level", level}, extra, command...)
	return rep, code
}

// verifyDRA runs dpkit GLOBAL verify --dra -o json EXTRA -- COMMAND with
// the API server of kubeconfig and returns the report, the exit status and
// what it wrote on stderr.
func verifyDRA(t *testing.T, kubeconfig string, global, extra []string, command ...string) (*verify.Report, int, string) {
	t.Helper()
	args := append(append(slices.Clone(global), "verify", "--dra", "--kubeconfig", kubeconfig, "-o", "json"), extra...)
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
	return &rep, code, stderr.String()
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

// TestVerifyDRACleansUp runs dpkit verify --dra at the default log level
// on a driver that passes, on a control plane with kube-controller-manager
// and on one without (the suite's): stderr has no log line but, without
// the namespace controller, the one that names the namespace left
// Terminating and how to remove it, a command that works; the claims, the
// ResourceSlices and the Node are gone either way, the claims released
// first (none is left reserved for verify's pod, which never existed).
func TestVerifyDRACleansUp(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "fake-dra.yaml")
	if err := os.WriteFile(config, []byte(fakeDRAConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		kcm  bool
	}{{"with kube-controller-manager", true}, {"without kube-controller-manager", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var cp *controlplane.ControlPlane
			if tc.kcm {
				cp = controlplane.StartForTest(t, controlplane.Options{ControllerManager: true})
			} else {
				cp = cluster.Get(t)
			}
			before := verifyNamespaces(t, cp)
			rep, code, stderr := verifyDRA(t, cp.Kubeconfig, nil, nil, dpkitBinary(t), "plugin", "--config", config)
			if code != 0 || rep.Failed() {
				t.Fatalf("exit %d, failed checks %v; want none", code, failedChecks(rep))
			}
			client := cp.Client()
			ctx := t.Context()
			var ns []string
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if tc.kcm {
				// This control plane is the test's own: what is new is
				// the run's.
				for _, n := range verifyNamespaces(t, cp) {
					if !slices.Contains(before, n) {
						ns = append(ns, n)
					}
				}
				if stderr != "" || len(ns) != 0 {
					t.Errorf("namespaces left %v; stderr at the default log level:\n%s\nwant none and nothing: the report is stdout's", ns, stderr)
				}
				nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
				if err != nil || len(nodes.Items) != 0 {
					t.Errorf("Nodes left: %v (%v)", nodes, err)
				}
				sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
				if err != nil || len(sl.Items) != 0 {
					t.Errorf("ResourceSlices left: %v (%v)", sl, err)
				}
			} else {
				m := regexp.MustCompile(`level=WARN .*object="Namespace (dpkit-verify-[a-z0-9]+)"`).FindStringSubmatch(lines[0])
				if len(lines) != 1 || m == nil {
					t.Fatalf("stderr at the default log level:\n%s\nwant one warning naming the namespace left", stderr)
				}
				ns = []string{m[1]}
				n, err := client.CoreV1().Namespaces().Get(ctx, ns[0], metav1.GetOptions{})
				if err != nil || n.DeletionTimestamp == nil {
					t.Fatalf("namespace %s: %v, %v; want it Terminating", ns[0], n, err)
				}
			}
			for _, n := range ns {
				claims, err := client.ResourceV1().ResourceClaims(n).List(ctx, metav1.ListOptions{})
				if err != nil || len(claims.Items) != 0 {
					t.Errorf("claims left in %s: %v (%v)", n, claims, err)
				}
				node := n // the run's node and namespace have one name
				if _, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					t.Errorf("Node %s: %v, want it gone", node, err)
				}
				sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
				if err != nil || len(sl.Items) != 0 {
					t.Errorf("ResourceSlices of %s left: %v (%v)", node, sl, err)
				}
			}
			if tc.kcm {
				return
			}
			// The command the warning gives removes the namespace.
			m := regexp.MustCompile(`remove=("(?:[^"\\]|\\.)*")`).FindStringSubmatch(lines[0])
			if m == nil {
				t.Fatalf("no remove= in %q", lines[0])
			}
			remove, err := strconv.Unquote(m[1])
			if err != nil {
				t.Fatal(err)
			}
			_, command, ok := strings.Cut(remove, "or: ")
			if !ok || cp.Kubectl == "" {
				t.Fatalf("remove=%q: want a kubectl command after \"or: \" (kubectl %q)", remove, cp.Kubectl)
			}
			sh := exec.CommandContext(ctx, "sh", "-c", command)
			sh.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig, "PATH="+filepath.Dir(cp.Kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"))
			if out, err := sh.CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", command, err, out)
			}
			if _, err := client.CoreV1().Namespaces().Get(ctx, ns[0], metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("namespace %s after the command the warning gives: %v, want it gone", ns[0], err)
			}
		})
	}
}

// verifyNamespaces lists the namespaces dpkit verify --dra creates.
func verifyNamespaces(t *testing.T, cp *controlplane.ControlPlane) []string {
	t.Helper()
	l, err := cp.Client().CoreV1().Namespaces().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range l.Items {
		if strings.HasPrefix(n.Name, "dpkit-verify-") {
			out = append(out, n.Name)
		}
	}
	return out
}
