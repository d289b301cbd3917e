package draverify

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/dpkit/dpkit/pkg/verify"
)

// The unit tests of the DRA checker's verdicts that need no API server:
// what the kubelet refuses at registration, how a re-registration is
// judged, when a driver's pools are complete and which devices they
// offer, and how a result reaches the report.

// newRun is a run with every check undecided, for the verdicts alone.
func newRun(cfg verify.DRAConfig) *run {
	cfg.Command = []string{"driver"}
	r := &run{cfg: withDefaults(cfg), log: slog.New(slog.DiscardHandler), results: map[string]*verify.Result{}, reported: map[string]bool{}}
	for _, c := range verify.DRAChecks() {
		r.results[c.ID] = &verify.Result{}
	}
	return r
}

// TestRegistrationProblems: a registration the kubelet would refuse (a
// name that is no DNS subdomain of at most 63 characters, a version that
// is no gRPC service name) or one whose endpoint is outside the plugins
// directory fails dra.registration, each problem named.
func TestRegistrationProblems(t *testing.T) {
	t.Parallel()
	const dir = "/tmp/dpvd1/plugins"
	ok := registration{name: "gpu.example.com", endpoint: dir + "/gpu.example.com/dra.sock", versions: []string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"}}
	for _, tc := range []struct {
		name string
		edit func(*registration)
		want []string // a substring of each problem, in order
	}{
		{"valid", func(*registration) {}, nil},
		{"name with capitals", func(r *registration) { r.name = "GPU.example.com" }, []string{`driver name "GPU.example.com" is not a DNS subdomain`}},
		{"name of 64 characters", func(r *registration) { r.name = strings.Repeat("a", 52) + ".example.com" }, []string{"is not a DNS subdomain of at most 63 characters"}},
		{"name of 63 characters", func(r *registration) { r.name = strings.Repeat("a", 51) + ".example.com" }, nil},
		{"version not a service", func(r *registration) { r.versions = []string{"v1.DRAPlugin", "1.0"} }, []string{`version "1.0" is not a gRPC service name`}},
		{"version without a service", func(r *registration) { r.versions = []string{"v1"} }, []string{`version "v1" is not`}},
		{"endpoint elsewhere", func(r *registration) { r.endpoint = "/var/lib/kubelet/plugins/gpu/dra.sock" }, []string{"endpoint /var/lib/kubelet/plugins/gpu/dra.sock is not under the plugins directory " + dir}},
		{"endpoint escaping", func(r *registration) { r.endpoint = dir + "/../gpu.sock" }, []string{"is not under the plugins directory"}},
		{"every problem", func(r *registration) { r.name, r.versions, r.endpoint = "_", []string{"x"}, "/x.sock" },
			[]string{`driver name "_"`, `version "x"`, "endpoint /x.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			reg := ok
			reg.versions = slices.Clone(ok.versions)
			tc.edit(&reg)
			got := registrationProblems(reg, dir)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d: %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestJudgeRestart: registering again within ReregisterWarn passes, later
// warns with the time it took, and not at all within ReregisterThreshold
// fails.
func TestJudgeRestart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		took   time.Duration
		ok     bool
		want   verify.Verdict
		detail string
	}{
		{"at once", 30 * time.Millisecond, true, verify.Pass, "registered again 30ms after the kubelet restarted"},
		{"at the warning", time.Second, true, verify.Pass, "registered again 1s after"},
		{"slow", 1500 * time.Millisecond, true, verify.Warn, "registered again 1.5s after the kubelet restarted (over 1s)"},
		{"not at all", 10 * time.Second, false, verify.Fail, "not registered again within 10s after the kubelet restarted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRun(verify.DRAConfig{})
			r.judgeRestart(verify.CheckDRAKubeletRestart, tc.took, tc.ok, "the kubelet restarted")
			res := r.results[verify.CheckDRAKubeletRestart]
			if res.Verdict != tc.want || !strings.Contains(res.Detail, tc.detail) {
				t.Errorf("%+v, want %s with %q", *res, tc.want, tc.detail)
			}
		})
	}
}

func poolSlice(name, pool string, gen, count int64, node string, devices ...string) resourcev1.ResourceSlice {
	s := resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "gpu.example.com", Pool: resourcev1.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: count}, NodeName: ptr.To(node),
	}}
	for _, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d})
	}
	return s
}

// TestCompletePools: the driver is done publishing when the newest
// generation of every pool has all its resourceSliceCount slices; an
// older generation's slices do not count.
func TestCompletePools(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sl   []resourcev1.ResourceSlice
		want bool
	}{
		{"none", nil, false},
		{"one of one", []resourcev1.ResourceSlice{poolSlice("a", "p", 1, 1, "n", "d0")}, true},
		{"one of two", []resourcev1.ResourceSlice{poolSlice("a", "p", 1, 2, "n", "d0")}, false},
		{"two of two", []resourcev1.ResourceSlice{poolSlice("a", "p", 1, 2, "n", "d0"), poolSlice("b", "p", 1, 2, "n", "d1")}, true},
		{"the newest generation incomplete", []resourcev1.ResourceSlice{poolSlice("a", "p", 1, 1, "n", "d0"), poolSlice("b", "p", 2, 2, "n", "d1")}, false},
		{"an old generation left over", []resourcev1.ResourceSlice{poolSlice("a", "p", 1, 2, "n", "d0"), poolSlice("b", "p", 2, 1, "n", "d1")}, true},
		{"one pool of two incomplete", []resourcev1.ResourceSlice{poolSlice("a", "p", 1, 1, "n", "d0"), poolSlice("b", "q", 1, 2, "n", "d1")}, false},
	} {
		if got := complete(tc.sl); got != tc.want {
			t.Errorf("%s: complete = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDeviceNames: the devices dra.slices.valid and dra.slices.republished
// compare are those of the newest generation of the pool offered to the
// node, sorted, a name listed twice there twice (listedTwice names it).
func TestDeviceNames(t *testing.T) {
	t.Parallel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	sl := []resourcev1.ResourceSlice{
		poolSlice("old", "p", 1, 1, "n", "gone"),
		poolSlice("a", "p", 2, 2, "n", "d1", "d0"),
		poolSlice("b", "p", 2, 2, "n", "d1", "d2"),
		poolSlice("other-node", "p", 2, 2, "m", "d9"),
		poolSlice("other-pool", "q", 3, 1, "n", "x"),
	}
	if got := newestGeneration(sl, "p"); got != 2 {
		t.Errorf("newestGeneration(p) = %d, want 2", got)
	}
	if got := newestGeneration(sl, "none"); got != -1 {
		t.Errorf("newestGeneration of a pool without slices = %d, want -1", got)
	}
	got := deviceNames(sl, "p", node)
	if want := []string{"d0", "d1", "d1", "d2"}; !slices.Equal(got, want) {
		t.Errorf("deviceNames(p) = %q, want %q", got, want)
	}
	if twice := listedTwice(got); !slices.Equal(twice, []string{"d1"}) {
		t.Errorf("listedTwice(%q) = %q, want [d1]", got, twice)
	}
	if twice := listedTwice([]string{"a", "a", "a", "b"}); !slices.Equal(twice, []string{"a"}) {
		t.Errorf("listedTwice of a name three times = %q, want it once", twice)
	}
}

// TestFinalResult: a result reaches the report with its check's texts,
// and with the fix and the link to docs/verify.md only when it failed or
// warned.
func TestFinalResult(t *testing.T) {
	t.Parallel()
	var info verify.CheckInfo
	for _, c := range verify.DRAChecks() {
		if c.ID == verify.CheckDRACDI {
			info = c
		}
	}
	for _, v := range []verify.Verdict{verify.Pass, verify.Fail, verify.Warn, verify.Skip} {
		res := final(info, verify.Result{Verdict: v, Detail: "seen"})
		if res.ID != info.ID || res.Description != info.Description || res.Basis != info.Basis || res.Detail != "seen" || res.Verdict != v {
			t.Errorf("%s: %+v, want the check's texts and the detail", v, res)
		}
		withFix := v == verify.Fail || v == verify.Warn
		if (res.Fix == info.Fix && res.Docs == info.DocsURL()) != withFix || (res.Fix == "") == withFix {
			t.Errorf("%s: fix %q, docs %q; want them only when failed or warned", v, res.Fix, res.Docs)
		}
	}
}

// TestRunConfiguration: Run refuses a configuration without a command or
// with a negative duration, and one without an API server, before it
// starts anything; unset durations get the kubelet's defaults.
func TestRunConfiguration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	api := &rest.Config{Host: "https://127.0.0.1:1"}
	if _, err := Run(ctx, api, verify.DRAConfig{}); err == nil || !strings.Contains(err.Error(), "command") {
		t.Errorf("Run without a command: %v, want an error naming the command", err)
	}
	if _, err := Run(ctx, api, verify.DRAConfig{Command: []string{"driver"}, PrepareTimeout: -time.Second}); err == nil || !strings.Contains(err.Error(), "prepareTimeout") {
		t.Errorf("Run with a negative prepare timeout: %v, want an error naming prepareTimeout", err)
	}
	if _, err := Run(ctx, nil, verify.DRAConfig{Command: []string{"driver"}}); err == nil || !strings.Contains(err.Error(), "API server") {
		t.Errorf("Run without an API server: %v, want an error saying so", err)
	}
	if _, err := Cleanup(ctx, nil, verify.DRACleanupConfig{}); err == nil {
		t.Error("Cleanup without an API server: no error")
	}
	c := withDefaults(verify.DRAConfig{PrepareTimeout: time.Second})
	if c.PrepareTimeout != time.Second || c.HealthTimeout != verify.DefaultDRAHealthTimeout || c.RegisterTimeout != verify.DefaultDRARegisterTimeout ||
		c.ReregisterThreshold != verify.DefaultDRAReregisterThreshold || c.ReregisterWarn != verify.DefaultDRAReregisterWarn ||
		c.TermTimeout != verify.DefaultTermTimeout || c.CallTimeout != verify.DefaultCallTimeout || c.Logger == nil || c.Env == nil {
		t.Errorf("withDefaults: timeouts register %s, reregister %s/%s, prepare %s, health %s, term %s, call %s, logger %v, %d env; want the given prepare timeout and every other default",
			c.RegisterTimeout, c.ReregisterWarn, c.ReregisterThreshold, c.PrepareTimeout, c.HealthTimeout, c.TermTimeout, c.CallTimeout, c.Logger != nil, len(c.Env))
	}
}
