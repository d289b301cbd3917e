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
	"strings"
	"sync"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

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
		t.Fatalf("exit %d, want no failed check; failed: %s", code, failures(rep))
	}
	if len(rep.Results) != len(verify.DRAChecks()) {
		t.Errorf("%d results, want one per check (%d)", len(rep.Results), len(verify.DRAChecks()))
	}
	for _, r := range rep.Results {
		// The fake plugin's devices do not change during the run, and
		// the DRA front publishes no partitionable devices or
		// consumable capacity and writes no claim status.
		if r.Verdict == verify.Skip && !slices.Contains(append([]string{verify.CheckDRAHealth, verify.CheckDRAGeneration}, optionalFeatureChecks...), r.ID) {
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
	// It writes claims' status.devices, which dpkit's RBAC does not grant.
	"--rbac", filepath.Join("..", "..", "internal", "testplugins", "brokendra", "rbac.yaml"),
}

// optionalFeatureChecks are the checks of features a driver may leave
// out, skipped when it does: partitionable devices, consumable capacity,
// the status of claims' devices. brokendra has them all; dpkit's DRA
// front and the upstream helper's fake driver none.
var optionalFeatureChecks = []string{verify.CheckDRAPartitionable, verify.CheckDRAConsumableCapacity, verify.CheckDRAClaimStatus}

// TestVerifyDRABrokenDriver runs dpkit verify --dra against every mode of
// the broken DRA driver: the mode without a bug, and the modes and flags
// marked "(no bug)" that do something another way verify must accept,
// pass every check (with the detail given, when one is); each other mode
// gets its check's verdict (a failure, or a warning for a time or for
// what the kubelet does not rely on) and no failure of any other check.
func TestVerifyDRABrokenDriver(t *testing.T) {
	t.Parallel()
	driver := brokenDRADriver(t)
	cases := []struct {
		name    string // default: the mode
		mode    string
		args    []string
		check   string
		verdict verify.Verdict // default Fail; Pass for a case of no bug with a detail to see
		detail  string         // in the check's detail
	}{
		{name: "no-bug"},
		// Correct drivers that do things another way.
		{mode: "in-place-update", check: verify.CheckDRAGeneration, verdict: verify.Pass, detail: "changed its devices in place in generation 1"},
		{mode: "node-selector", check: verify.CheckDRASlices, verdict: verify.Pass, detail: "by spec.nodeSelector"},
		{mode: "per-device-node", check: verify.CheckDRASlices, verdict: verify.Pass, detail: "by spec.perDeviceNodeSelection"},
		{name: "own-health-timeout", args: []string{"-health-check-timeout", "5s", "-health-interval", "3s"},
			check: verify.CheckDRAHealth, verdict: verify.Pass, detail: "timeout 5s (the driver's health_check_timeout_seconds)"},
		// Bugs.
		{mode: "exit-before-serve", check: verify.CheckDRARegistration},
		{mode: "bad-registration", check: verify.CheckDRARegistration},
		{mode: "register-once", check: verify.CheckDRAKubeletRestart},
		{mode: "slow-reregister", args: []string{"-delay", "1500ms"}, check: verify.CheckDRAKubeletRestart, verdict: verify.Warn},
		{mode: "stale-socket", check: verify.CheckDRADriverRestart},
		{mode: "bad-slices", check: verify.CheckDRASlices},
		{mode: "no-republish", check: verify.CheckDRASlicesRestart},
		{mode: "same-generation", check: verify.CheckDRAGeneration, detail: "lists device dev-1 in both"},
		{mode: "generation-backwards", check: verify.CheckDRAGeneration, detail: "generation 1, below generation 2"},
		{mode: "drop-result", check: verify.CheckDRAPrepare},
		{mode: "fresh-cdi-ids", check: verify.CheckDRAIdempotent},
		{mode: "whole-call-error", check: verify.CheckDRAPerClaimError},
		{mode: "unprepare-unknown", check: verify.CheckDRAUnknownClaim},
		{mode: "no-cdi-spec", check: verify.CheckDRACDI},
		{mode: "bad-cdi-spec", check: verify.CheckDRACDI},
		{mode: "no-cdi-rewrite", check: verify.CheckDRAReboot},
		{mode: "share-device", check: verify.CheckDRASharedDevice, verdict: verify.Warn, detail: "claim-shared, without admin access, was prepared"},
		{mode: "refuse-admin", check: verify.CheckDRASharedDevice, detail: "claim-admin, allocated device dev-0 with adminAccess while claim-a holds it, was refused: device dev-0 is prepared for claim"},
		{mode: "slow-prepare", args: []string{"-delay", "3s"}, check: verify.CheckDRATimeout},
		{mode: "health-once", check: verify.CheckDRAHealth},
		{name: "late-health", args: []string{"-health-check-timeout", "1s", "-health-interval", "1500ms"},
			check: verify.CheckDRAHealth, verdict: verify.Warn, detail: "(timeout 1s)"},
		{mode: "ignore-sigterm", check: verify.CheckDRAExit},
		{mode: "slow-exit", args: []string{"-delay", "3s"}, check: verify.CheckDRAExit, verdict: verify.Warn, detail: "over --term-timeout 2s"},
		{mode: "leave-sockets", check: verify.CheckDRAExit},
		// What breaks drivers across their life.
		{mode: "unprepare-first-only", check: verify.CheckDRABatch, detail: "their CDI specs still define"},
		{mode: "busy", check: verify.CheckDRAConcurrent, detail: "busy: another NodePrepareResources call is in progress"},
		{mode: "ignore-pool", check: verify.CheckDRAOtherNode, detail: "was prepared"},
		{mode: "unprepare-reads-claim", check: verify.CheckDRADeletedClaim, detail: "read the claim"},
		{mode: "forget-after-restart", check: verify.CheckDRAUnprepareRestart, detail: "its CDI spec still defines"},
		{mode: "shared-registration", check: verify.CheckDRARollingUpdate, detail: "the same name as the first's"},
		{mode: "v1-health-only", check: verify.CheckDRAVersionSkew, detail: "which watches v1alpha1.DRAResourceHealth"},
		{mode: "old-cdi-version", check: verify.CheckDRACDIValid, detail: "the spec version must be at least v0.6.0"},
		{mode: "cdi-device-names", check: verify.CheckDRACDIUnique, detail: "with claim-admin"},
		{mode: "keep-subrequest", check: verify.CheckDRAPrioritizedList, detail: `request names ["req/small"]`},
		{mode: "bad-device-status", check: verify.CheckDRAClaimStatus, detail: "the API server refused"},
		{mode: "bad-counters", check: verify.CheckDRAPartitionable, detail: "counter set chip-9"},
		{mode: "bad-request-policy", check: verify.CheckDRAConsumableCapacity, detail: "default 20Gi is above"},
		{mode: "refuse-shares", check: verify.CheckDRAConsumableCapacity, detail: "claim-share-2"},
		{mode: "no-share-id", check: verify.CheckDRAConsumableCapacity, verdict: verify.Warn, detail: "without share_id"},
		{mode: "health-extra-device", check: verify.CheckDRAHealthDevices, detail: "/dev-9"},
	}
	for _, tc := range cases {
		name := tc.name
		if name == "" {
			name = tc.mode
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			command := append([]string{driver, "-mode", tc.mode, "-health-interval", "500ms"}, tc.args...)
			rep, code := runVerifyDRA(t, brokenDRAFlags, command...)
			if len(rep.Results) != len(verify.DRAChecks()) {
				t.Errorf("%d results, want one per check (%d)", len(rep.Results), len(verify.DRAChecks()))
			}
			for _, r := range rep.Results {
				if r.ID == tc.check && !strings.Contains(r.Detail, tc.detail) {
					t.Errorf("%s: %s (%s), want %q in the detail", r.ID, r.Verdict, r.Detail, tc.detail)
				}
			}
			if tc.check == "" || tc.verdict == verify.Pass {
				if code != 0 || rep.Failed() {
					t.Errorf("exit %d, want no failed check; failed: %s", code, failures(rep))
				}
				for _, r := range rep.Results {
					switch {
					case r.Verdict == verify.Skip:
						t.Errorf("%s skipped: %s", r.ID, r.Detail)
					case r.ID == tc.check && r.Verdict != verify.Pass:
						t.Errorf("%s: %s (%s), want PASS", r.ID, r.Verdict, r.Detail)
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
// (cmd/dpkit-fakedra), as it is, serving only v1beta1.DRAPlugin
// (--v1beta1-only: verify calls it in v1beta1, as the kubelet does), and
// declining health (--no-health: the helper answers the stream with
// Unimplemented, and dra.health is skipped). What the helper does
// (registration, stale sockets, ResourceSlices and their generation,
// per-claim errors, admin access, health, shutdown) passes. The one
// failure, dra.prepare.cdi, is a bug of the fake driver on top:
// PrepareResourceClaims (internal/fakedra/fakedra.go:258)
// returns CDI device IDs that no CDI spec defines, since it writes none.
// dra.prepare.shared-device warns: the fake prepares whatever the
// allocation names (internal/fakedra/fakedra.go:248-260) and does not keep
// which claim holds a device, a defense the helper leaves to the driver.
// The fake runs with --rolling-update {pod-uid} (the helper's
// RollingUpdate, sockets named with the pod's UID, calls serialized
// through a file lock), and dra.registration.rolling-update passes;
// dra.unprepare.after-restart and dra.unprepare.deleted-claim are skipped,
// pointing to dra.prepare.cdi: with no spec written there is none whose
// removal to judge (their Unprepares succeed).
func TestVerifyDRAUpstreamHelper(t *testing.T) {
	t.Parallel()
	fakedra := dratest.Binary(t)
	for _, tc := range []struct {
		name  string
		args  []string
		check func(t *testing.T, r verify.Result)
	}{
		{name: "default"},
		{name: "v1beta1-only", args: []string{"--v1beta1-only"}, check: func(t *testing.T, r verify.Result) {
			if r.ID == verify.CheckDRARegistration && !strings.Contains(r.Detail, "called in "+drav1beta1.DRAPluginService) {
				t.Errorf("%s: %s (%s), want it called in %s", r.ID, r.Verdict, r.Detail, drav1beta1.DRAPluginService)
			}
		}},
		{name: "no-health", args: []string{"--no-health"}, check: func(t *testing.T, r verify.Result) {
			if r.ID == verify.CheckDRAHealth && (r.Verdict != verify.Skip || !strings.Contains(r.Detail, "Unimplemented")) {
				t.Errorf("%s: %s (%s), want SKIP: the driver answers Unimplemented", r.ID, r.Verdict, r.Detail)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			command := append([]string{fakedra, "--registry-dir", "{registry-dir}", "--kubeconfig", "{kubeconfig}", "--node-name", "{node-name}", "--resend", "500ms",
				"--rolling-update", "{pod-uid}"}, tc.args...)
			rep, code := runVerifyDRA(t, []string{"--health-timeout", "2s"}, command...)
			want := []string{verify.CheckDRACDI}
			if got := failedChecks(rep); code != 1 || !slices.Equal(got, want) {
				t.Errorf("exit %d, failed checks %v; want exit 1 and %v", code, got, want)
			}
			for _, r := range rep.Results {
				switch {
				case r.ID == verify.CheckDRASharedDevice && r.Verdict != verify.Warn:
					t.Errorf("%s: %s (%s), want WARN: the fake prepares a second claim without admin access", r.ID, r.Verdict, r.Detail)
				// The CDI checks past dra.prepare.cdi point to it; the
				// published devices of health are skipped with no health.
				case r.Verdict == verify.Skip && !slices.Contains(append([]string{verify.CheckDRAReboot, verify.CheckDRAGeneration, verify.CheckDRAHealth,
					verify.CheckDRACDIValid, verify.CheckDRACDIUnique, verify.CheckDRAHealthDevices,
					verify.CheckDRAUnprepareRestart, verify.CheckDRADeletedClaim}, optionalFeatureChecks...), r.ID):
					t.Errorf("%s skipped: %s", r.ID, r.Detail)
				case r.ID == verify.CheckDRAHealth && tc.name != "no-health" && r.Verdict != verify.Pass:
					t.Errorf("%s: %s (%s), want PASS", r.ID, r.Verdict, r.Detail)
				case r.ID == verify.CheckDRAHealthDevices && tc.name != "no-health" && r.Verdict != verify.Pass:
					t.Errorf("%s: %s (%s), want PASS: the helper reports health under the published names", r.ID, r.Verdict, r.Detail)
				}
				if tc.check != nil {
					tc.check(t, r)
				}
			}
		})
	}
}

// TestVerifyDRACleansUp runs dpkit verify --dra on a driver that passes,
// granted dpkit's own RBAC, on a control plane with
// kube-controller-manager and on one without (the suite's): stderr has
// nothing above DEBUG (the debug log tells the run's ID), and the claims (released first: none is left reserved for
// verify's pod, which never existed), the ResourceSlices, the Node, the
// namespace (removed by the namespace controller, or by verify when none
// has removed it within 15s) and the driver's ServiceAccount and RBAC are
// gone either way. How long the namespace controller takes (about 5s
// here, up to its minute of back-off when it retries) does not decide the
// outcome: verify finalizes the emptied namespace itself when the
// controller has not removed it in time.
func TestVerifyDRACleansUp(t *testing.T) {
	t.Parallel()
	config := filepath.Join(t.TempDir(), "fake-dra.yaml")
	if err := os.WriteFile(config, []byte(fakeDRAConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		kcm   bool
		extra []string
	}{
		{"with kube-controller-manager", true, nil},
		{"without kube-controller-manager", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var cp *controlplane.ControlPlane
			if tc.kcm {
				cp = controlplane.StartForTest(t, controlplane.Options{ControllerManager: true})
			} else {
				cp = cluster.Get(t)
			}
			rep, code, stderr := verifyDRA(t, cp.Kubeconfig, []string{"--log-level", "debug"}, tc.extra, dpkitBinary(t), "plugin", "--config", config)
			if code != 0 || rep.Failed() {
				t.Fatalf("exit %d, want no failed check; failed: %s", code, failures(rep))
			}
			if r := result(t, rep, verify.CheckDRARBAC); r.Verdict != verify.Pass {
				t.Errorf("%s: %s (%s), want a pass: dpkit plugin needs no more than deploy/components/dra/rbac.yaml", r.ID, r.Verdict, r.Detail)
			}
			// At the default level: the debug lines are verify's own.
			var above []string
			for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
				if l != "" && !strings.Contains(l, "level=DEBUG") {
					above = append(above, l)
				}
			}
			if len(above) > 0 {
				t.Errorf("stderr above DEBUG:\n%s\nwant nothing: the report is stdout's", strings.Join(above, "\n"))
			}
			m := regexp.MustCompile(`msg="Verify run set up" run=([a-z0-9]+) `).FindStringSubmatch(stderr)
			if m == nil {
				t.Fatalf("no run set up in verify's log")
			}
			id := m[1]
			if gone := regexp.MustCompile(`msg="The run's namespace is gone" .* by=("[^"]*"|\S+)`).FindStringSubmatch(stderr); gone != nil {
				t.Logf("the run's namespace was removed by %s", gone[1])
			}
			client := cp.Client()
			ctx := t.Context()
			if left := labelled(t, client, id); len(left) > 0 {
				t.Errorf("objects of the run left: %v", left)
			}
			name := "dpkit-verify-" + id // the run's node and namespace
			if _, err := client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Namespace %s: %v, want it gone", name, err)
			}
			if _, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Node %s: %v, want it gone", name, err)
			}
			sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + name})
			if err != nil || len(sl.Items) != 0 {
				t.Errorf("ResourceSlices of %s left: %v (%v)", name, sl, err)
			}
		})
	}
}

// TestVerifyDRAVendorPlugins runs dpkit verify --dra against the amdgpu
// and nvidia plugins, both fronts, on fixture hosts: 8 MI300X in the CPX
// mode (64 compute partitions of 8 counter sets) and a DGX-H100 whose
// GPUs are shared in memory shares beside 4 time-slicing replicas each.
func TestVerifyDRAVendorPlugins(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, host, config string
		pass               string // the check that must pass, not be skipped
	}{
		{"amdgpu-cpx", "mi300x", "- amdgpu: {computePartition: CPX}\n", verify.CheckDRAPartitionable},
		{"nvidia-shared", "dgx-h100", "- nvidia: {replicas: 4, shared: {memory: {min: 1Gi, step: 1Gi}}}\n", verify.CheckDRAConsumableCapacity},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			config := filepath.Join(t.TempDir(), "plugin.yaml")
			body := "apiVersion: dpkit.io/v1alpha1\nkind: PluginConfig\nplugins:\n" + tc.config + "  fronts: [deviceplugin, dra]\n"
			if err := os.WriteFile(config, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			host, err := filepath.Abs(filepath.Join("..", "..", "pkg", "discovery", "testdata", "hosts", tc.host))
			if err != nil {
				t.Fatal(err)
			}
			rep, code := runVerifyDRA(t, nil, dpkitBinary(t), "plugin", "--config", config,
				"--sysfs-root", filepath.Join(host, "sys"), "--dev-root", filepath.Join(host, "dev"), "--proc-root", filepath.Join(host, "proc"))
			if code != 0 || rep.Failed() {
				t.Fatalf("exit %d, want no failed check; failed: %s", code, failures(rep))
			}
			if r := rep.Result(tc.pass); r.Verdict != verify.Pass {
				t.Errorf("%s: %s (%s), want pass", tc.pass, r.Verdict, r.Detail)
			}
		})
	}
}
