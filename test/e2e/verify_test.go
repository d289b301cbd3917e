package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpkit/dpkit/pkg/verify"
	"github.com/dpkit/dpkit/test/upstream"
)

// TestVerifyUpstreamSamplePlugin runs dpkit verify against the kubelet's
// own sample device plugin. Through kubelet.sock (which it hard-codes, so
// --private-mount, as root) it must fail the restart checks: it registers
// again only 10s after kubelet.sock is re-created and never after its
// socket is deleted. Through the plugin watcher it must pass.
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
		want := []string{verify.CheckKubeletRestart, verify.CheckSocketDeleted}
		if got := failedChecks(rep); !slices.Equal(got, want) {
			t.Errorf("failed checks %v, want %v", got, want)
		}
		if d := rep.Result(verify.CheckKubeletRestart).Detail; !strings.Contains(d, "above the 5s threshold") && !strings.Contains(d, "did not register again") {
			t.Errorf("%s detail %q does not say it was too slow", verify.CheckKubeletRestart, d)
		}
		var b strings.Builder
		if err := rep.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		for _, id := range want {
			if !strings.Contains(b.String(), "FAIL "+id) {
				t.Errorf("table does not name failed check %s:\n%s", id, b.String())
			}
		}
		if !strings.Contains(b.String(), "2 failed") {
			t.Errorf("summary does not count 2 failures:\n%s", b.String())
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
			t.Errorf("failed checks %v, want none", got)
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
