package verify_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/verify"
)

// bins holds the binaries TestMain builds: the dpkit command, the
// deliberately broken plugin, the README's plugin (examples/myplugin) and
// its broken copies under testdata/sdkplugins, by directory name.
var bins struct {
	dpkit, broken, myplugin, dir string
	sdk                          map[string]string
}

// sdkPlugins are the directories under testdata/sdkplugins: the README's
// plugin (examples/myplugin), each with one bug.
var sdkPlugins = []string{"allocate-fails", "partial-update", "duplicate-id", "no-notify"}

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "dpvbin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bins.dir = dir
		bins.dpkit = filepath.Join(dir, "dpkit")
		bins.broken = filepath.Join(dir, "broken")
		bins.myplugin = filepath.Join(dir, "myplugin")
		builds := map[string]string{bins.dpkit: "./cmd/dpkit", bins.broken: "./internal/testplugins/broken", bins.myplugin: "./examples/myplugin"}
		bins.sdk = map[string]string{}
		for _, name := range sdkPlugins {
			bins.sdk[name] = filepath.Join(dir, "sdk-"+name)
			builds[bins.sdk[name]] = "./pkg/verify/testdata/sdkplugins/" + name
		}
		for out, pkg := range builds {
			cmd := exec.Command("go", "build", "-o", out, pkg)
			cmd.Dir = "../.."
			if b, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build %s: %v\n%s", pkg, err, b)
				return 1
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

// testConfig is a configuration with short timeouts for tests. It warns
// about slow re-registration only at the threshold, where it fails: on a
// loaded test machine a healthy plugin may take over a second.
func testConfig(command ...string) verify.Config {
	return verify.Config{
		Command:             command,
		RegisterTimeout:     15 * time.Second,
		ReregisterThreshold: 2 * time.Second,
		ReregisterWarn:      2 * time.Second,
		Restarts:            2,
		TermTimeout:         3 * time.Second,
		QuietPeriod:         300 * time.Millisecond,
		HealthWait:          3 * time.Second,
		CallTimeout:         3 * time.Second,
		DialTimeout:         time.Second,
	}
}

func run(t *testing.T, cfg verify.Config) *verify.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := verify.Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var b strings.Builder
	_ = rep.WriteTable(&b)
	t.Logf("%s\n%s", strings.Join(rep.Command, " "), b.String())
	if len(rep.Results) != len(verify.Checks()) {
		t.Errorf("%d results, want one per check (%d)", len(rep.Results), len(verify.Checks()))
	}
	return rep
}

func failed(rep *verify.Report) []string { return withVerdict(rep, verify.Fail) }

func warned(rep *verify.Report) []string { return withVerdict(rep, verify.Warn) }

func withVerdict(rep *verify.Report, v verify.Verdict) []string {
	var out []string
	for _, r := range rep.Results {
		if r.Verdict == v {
			out = append(out, r.ID)
		}
	}
	return out
}

const hosts = "../discovery/testdata/hosts"

func hostFlags(host string) []string {
	root := filepath.Join(hosts, host)
	return []string{"--sysfs-root", filepath.Join(root, "sys"), "--dev-root", filepath.Join(root, "dev"), "--proc-root", filepath.Join(root, "proc")}
}

// TestDpkitPlugins runs dpkit's own plugins, as processes of the dpkit
// binary, through every check: none may fail.
func TestDpkitPlugins(t *testing.T) {
	t.Parallel()
	plugin := func(config string, extra ...string) []string {
		return append([]string{bins.dpkit, "plugin", "--config", config, "--plugin-dir", "{plugin-dir}"}, extra...)
	}
	tests := []struct {
		name    string
		cfg     verify.Config
		passing []string // checks that must pass, not only not fail
	}{
		{name: "fake example", cfg: testConfig(plugin("../../examples/fake.yaml", "--registration", "kubelet")...),
			passing: []string{verify.CheckKubeletRestart, verify.CheckSocketDeleted, verify.CheckOldEndpoint, verify.CheckResponses, verify.CheckDeviceIDs, verify.CheckExit}},
		{name: "fake full", cfg: testConfig(plugin("testdata/fake-full.yaml", "--registration", "kubelet")...),
			passing: []string{verify.CheckHealth, verify.CheckFullList, verify.CheckUnhealthy, verify.CheckPrefSize, verify.CheckPrefMust, verify.CheckPrefAvailable, verify.CheckPreStart}},
		{name: "generic laptop", cfg: testConfig(plugin("../../examples/generic.yaml", append([]string{"--registration", "kubelet"}, hostFlags("laptop")...)...)...)},
		{name: "amdgpu mi250", cfg: testConfig(plugin("../../examples/amdgpu.yaml", append([]string{"--registration", "kubelet"}, hostFlags("mi250")...)...)...)},
		{name: "nvidia dgx-h100", cfg: testConfig(plugin("../../examples/nvidia.yaml", append([]string{"--registration", "kubelet"}, hostFlags("dgx-h100")...)...)...)},
		{name: "fake plugin watcher", cfg: func() verify.Config {
			c := testConfig(plugin("../../examples/fake.yaml", "--registration", "registry", "--registry-dir", "{registry-dir}")...)
			c.PluginWatcher = true
			return c
		}(), passing: []string{verify.CheckPluginWatcher}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep := run(t, tt.cfg)
			if f := failed(rep); len(f) > 0 {
				t.Errorf("failed checks %v, want none", f)
			}
			for _, id := range tt.passing {
				if r := rep.Result(id); r.Verdict != verify.Pass {
					t.Errorf("%s: %s (%s), want pass", id, r.Verdict, r.Detail)
				}
			}
		})
	}
}

// TestBrokenPlugins runs plugins with one deliberate bug each: the check
// aimed at the bug must fail (or warn, for the checks that only warn), and
// no other check may fail or warn.
func TestBrokenPlugins(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string // default: the mode
		mode  string
		args  []string
		cfg   func(*verify.Config)
		fails string
		warns string
	}{
		{name: "correct", mode: ""},
		{mode: "register-before-serve", fails: verify.CheckServing},
		{mode: "bad-version", fails: verify.CheckVersion},
		{mode: "bad-name", fails: verify.CheckResourceName},
		{mode: "claims-preferred", fails: verify.CheckOptions},
		{mode: "duplicate-ids", fails: verify.CheckFirstMessage},
		// The flip comes before the concurrent-streams check, which must
		// not fail for the partial list the kubelet's stream then has.
		{mode: "partial-updates", args: []string{"-flip-after", "100ms"}, fails: verify.CheckFullList},
		// The flip comes while verify waits for a health change, after the
		// Allocate checks.
		{mode: "drop-on-update", args: []string{"-flip-after", "2s"}, warns: verify.CheckVanished},
		{mode: "odd-ids", fails: verify.CheckDeviceIDs},
		{mode: "single-stream", fails: verify.CheckStreams},
		{mode: "health-first-stream", fails: verify.CheckHealth},
		{mode: "oversize", fails: verify.CheckMessageSize},
		{mode: "one-response", fails: verify.CheckResponses},
		{mode: "accept-unknown", fails: verify.CheckUnknown},
		{mode: "accept-unhealthy", fails: verify.CheckUnhealthy},
		{mode: "no-concurrent-allocate", fails: verify.CheckConcurrent},
		{mode: "allocate-fails-one", fails: verify.CheckEveryDevice},
		{mode: "allocate-fails-several", fails: verify.CheckEveryDevice},
		{mode: "one-device-per-container", warns: verify.CheckEveryDevice},
		{mode: "pref-wrong-size", fails: verify.CheckPrefSize},
		{mode: "ignore-must-include", fails: verify.CheckPrefMust},
		{mode: "pref-unavailable", fails: verify.CheckPrefAvailable},
		{mode: "prestart-fails", fails: verify.CheckPreStart},
		{mode: "slow-reregister", args: []string{"-delay", "3s"}, fails: verify.CheckKubeletRestart},
		{name: "slow-reregister under the threshold", mode: "slow-reregister", args: []string{"-delay", "1s"},
			cfg:   func(c *verify.Config) { c.ReregisterWarn, c.ReregisterThreshold = 500*time.Millisecond, 4*time.Second },
			warns: verify.CheckKubeletRestart},
		{mode: "ignore-socket-delete", warns: verify.CheckSocketDeleted},
		{mode: "reuse-socket", fails: verify.CheckOldEndpoint, warns: verify.CheckSocketDeleted},
		{mode: "storm", fails: verify.CheckSingleReg},
		{mode: "bad-getinfo", fails: verify.CheckPluginWatcher},
		{mode: "ignore-sigterm", fails: verify.CheckExit},
		{mode: "leave-socket", fails: verify.CheckSocketRemoved},
	}
	aimed := map[string]bool{}
	for _, tt := range tests {
		aimed[tt.fails], aimed[tt.warns] = true, true
	}
	for _, c := range verify.Checks() {
		if !aimed[c.ID] {
			t.Errorf("no broken plugin fails or warns check %s", c.ID)
		}
	}
	for _, tt := range tests {
		name := tt.name
		if name == "" {
			name = tt.mode
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(append([]string{bins.broken, "-mode", tt.mode}, tt.args...)...)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			rep := run(t, cfg)
			if got, want := failed(rep), nonEmpty(tt.fails); !slices.Equal(got, want) {
				t.Errorf("failed checks %v, want %v", got, want)
			}
			if got, want := warned(rep), nonEmpty(tt.warns); !slices.Equal(got, want) {
				t.Errorf("warned checks %v, want %v", got, want)
			}
			if rep.Failed() != (tt.fails != "") {
				t.Errorf("Report.Failed() is %t", rep.Failed())
			}
			// A plugin not built on the SDK gets the fixes for the raw API.
			if rep.SDK {
				t.Errorf("Report.SDK is true for a plugin written without the SDK")
			}
			for _, c := range verify.Checks() {
				if r := rep.Result(c.ID); (r.Verdict == verify.Fail || r.Verdict == verify.Warn) && r.Fix != c.Fix {
					t.Errorf("%s fix %q, want %q", c.ID, r.Fix, c.Fix)
				}
			}
		})
	}
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, x := range s {
		if x != "" {
			out = append(out, x)
		}
	}
	return out
}

// TestPrivateMount runs a plugin that only knows
// /var/lib/kubelet/device-plugins in its own mount namespace.
func TestPrivateMount(t *testing.T) {
	t.Parallel()
	cfg := testConfig(bins.broken, "-dir", pluginapi.DevicePluginPath)
	cfg.PrivateMount = true
	if os.Geteuid() != 0 {
		_, err := verify.Run(context.Background(), cfg)
		if err == nil || !strings.Contains(err.Error(), "needs root") {
			t.Fatalf("Run without root: %v, want an error saying it needs root", err)
		}
		t.Skip("--private-mount needs root; checked that it says so")
	}
	if runtime.GOOS != "linux" {
		t.Skip("mount namespaces are Linux-only")
	}
	rep := run(t, cfg)
	if f := failed(rep); len(f) > 0 {
		t.Errorf("failed checks %v, want none", f)
	}
	if _, err := os.Stat(filepath.Join(pluginapi.DevicePluginPath, "kubelet.sock")); err == nil {
		t.Errorf("%s/kubelet.sock exists in the test's mount namespace: the bind mount leaked", pluginapi.DevicePluginPath)
	}
}

// TestSocketDir verifies a plugin that was started before verify.
func TestSocketDir(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "dpvs")
	cmd := exec.Command(bins.broken, "-dir", dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	cfg := testConfig()
	cfg.SocketDir = dir
	rep := run(t, cfg)
	if f := failed(rep); len(f) > 0 {
		t.Errorf("failed checks %v, want none", f)
	}
	for _, id := range []string{verify.CheckExit, verify.CheckSocketRemoved} {
		if r := rep.Result(id); r.Verdict != verify.Skip || !strings.Contains(r.Detail, "already running") {
			t.Errorf("%s: %s %q, want skipped because the plugin was already running", id, r.Verdict, r.Detail)
		}
	}
	if r := rep.Result(verify.CheckKubeletRestart); r.Verdict != verify.Pass {
		t.Errorf("%s: %s %q, want pass", verify.CheckKubeletRestart, r.Verdict, r.Detail)
	}
}

// TestPluginDies checks "one cause, one failure": a plugin that exits
// before registering fails registration.serving only, saying how it
// exited, and one that exits during the run fails shutdown.exit only; the
// checks that depended on it are skipped with the reason.
func TestPluginDies(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		command []string
		fails   string
		detail  string // of the failure
		skipped string // the detail of the skipped checks contains it
	}{
		{name: "exit 0 at start", command: []string{"true"}, fails: verify.CheckServing,
			detail: "no Register call arrived: the plugin exited with status 0 before registering", skipped: "exited with status 0 before registering; see " + verify.CheckServing},
		{name: "exit 3 at start", command: []string{"sh", "-c", "exit 3"}, fails: verify.CheckServing,
			detail: "the plugin exited with status 3 before registering", skipped: "see " + verify.CheckServing},
		{name: "killed at start", command: []string{"sh", "-c", "kill -9 $$"}, fails: verify.CheckServing,
			detail: "the plugin was killed by signal 9 (killed) before registering", skipped: "see " + verify.CheckServing},
		{name: "dies on Allocate", command: []string{bins.broken, "-mode", "die-on-allocate"}, fails: verify.CheckExit,
			detail: "the plugin exited with status 2 on its own at", skipped: "the plugin exited with status 2 at"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep := run(t, testConfig(tt.command...))
			if got := failed(rep); !slices.Equal(got, []string{tt.fails}) {
				t.Fatalf("failed checks %v, want [%s]", got, tt.fails)
			}
			if d := rep.Result(tt.fails).Detail; !strings.Contains(d, tt.detail) || strings.Contains(d, "<nil>") {
				t.Errorf("%s detail %q, want it to contain %q", tt.fails, d, tt.detail)
			}
			skipped := 0
			for _, r := range rep.Results {
				if r.Verdict == verify.Skip && strings.Contains(r.Detail, tt.skipped) {
					skipped++
				}
			}
			if skipped == 0 {
				t.Errorf("no check skipped with a detail containing %q", tt.skipped)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  verify.Config
		want []string
	}{
		{"empty", verify.Config{}, []string{"command: Required"}},
		{"both", verify.Config{Command: []string{"x"}, SocketDir: "/run/dp"}, []string{"socketDir"}},
		{"relative dir", verify.Config{SocketDir: "dp"}, []string{"socketDir", "absolute"}},
		{"private mount with dir", verify.Config{SocketDir: "/run/dp", PrivateMount: true}, []string{"privateMount"}},
		{"negative", verify.Config{Command: []string{"x"}, TermTimeout: -time.Second, Restarts: -1}, []string{"termTimeout", "restarts"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
	if err := (verify.Config{Command: []string{"x"}}).Validate(); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// Every check has a description, a basis and a fix, and a section of
// docs/verify.md under the heading "### `<id>`" whose *Fix* is the
// check's fix word for word, and whose *Fix with the dpkit SDK* is the
// check's SDK fix, when it has one (the check definitions are the one
// source of the fixes; reflowing the docs is fine). The link a failure prints leads
// to that section: its fragment is the one GitHub makes of the heading.
func TestChecksCatalogue(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docs/verify.md")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{} // heading -> body
	for _, part := range strings.Split(string(data), "\n### ")[1:] {
		heading, body, _ := strings.Cut(part, "\n")
		body, _, _ = strings.Cut(body, "\n## ")
		sections[heading] = body
	}
	words := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	seen := map[string]bool{}
	for _, c := range append(verify.Checks(), verify.DRAChecks()...) {
		if seen[c.ID] {
			t.Errorf("duplicate check ID %s", c.ID)
		}
		seen[c.ID] = true
		if c.Description == "" || c.Basis == "" || c.Fix == "" {
			t.Errorf("%s: description, basis and fix are required", c.ID)
		}
		heading := "`" + c.ID + "`"
		body, ok := sections[heading]
		if !ok {
			t.Errorf("docs/verify.md has no section \"### %s\"", heading)
			continue
		}
		_, fix, ok := strings.Cut(body, "*Fix*: ")
		fix, _, _ = strings.Cut(fix, "\n\n")
		if !ok || words(fix) != words(c.Fix) {
			t.Errorf("docs/verify.md, section %s: *Fix* is\n\t%q\nwant the check's fix\n\t%q", heading, words(fix), c.Fix)
		}
		_, sdkFix, ok := strings.Cut(body, "*Fix with the dpkit SDK*: ")
		sdkFix, _, _ = strings.Cut(sdkFix, "\n\n")
		if ok != (c.SDKFix != "") || words(sdkFix) != words(c.SDKFix) {
			t.Errorf("docs/verify.md, section %s: *Fix with the dpkit SDK* is\n\t%q\nwant the check's SDK fix\n\t%q", heading, words(sdkFix), c.SDKFix)
		}
		if want := verify.DocsURL + "#" + githubAnchor(heading); c.DocsURL() != want {
			t.Errorf("%s: DocsURL %s, want %s", c.ID, c.DocsURL(), want)
		}
		if !strings.HasPrefix(c.ID, "dra.") {
			continue
		}
		// A DRA check says what it rests on, in the catalogue and in its
		// section's *Why*.
		if _, on, ok := strings.Cut(c.Basis, "Rests on: "); !ok || !restsOn.MatchString(on) {
			t.Errorf("%s: the basis %q ends with no \"Rests on: \" naming a code path (a .go file, an api.proto) or an API field (spec., status., metadata.)", c.ID, c.Basis)
		}
		_, why, ok := strings.Cut(body, "*Why*: ")
		why, _, _ = strings.Cut(why, "\n*")
		if !ok || !strings.EqualFold(words(why), words(c.Basis)) {
			t.Errorf("docs/verify.md, section %s: *Why* is\n\t%q\nwant the check's basis\n\t%q", heading, words(why), c.Basis)
		}
	}
}

// restsOn matches what a DRA check's basis rests on: a kubelet or
// library source file, the gRPC API's proto, or an API field.
var restsOn = regexp.MustCompile(`\.go\b|api\.proto|\b(spec|status|metadata|rules)(\.|\[\])[a-zA-Z]`)

// githubAnchor is the fragment GitHub gives a heading: lower case, spaces
// as '-', every other character but letters, digits, '-' and '_' dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// When nothing registers, registration.serving says where the plugin
// listens and how to fix it: outside the emulated directory (it does not
// take its directory from verify), inside it (it never calls Register), or
// on no socket at all.
func TestNoRegistrationSaysWhereThePluginServes(t *testing.T) {
	t.Parallel()
	elsewhere := t.TempDir()
	fake := func(extra ...string) []string {
		return append([]string{bins.dpkit, "plugin", "--config", "../../examples/fake.yaml"}, extra...)
	}
	tests := []struct {
		name    string
		command []string
		want    []string
	}{
		{"outside", fake("--plugin-dir", elsewhere, "--registration", "kubelet"),
			[]string{"the plugin listens on " + elsewhere + "/example_com_foo-", "outside the directory verify's kubelet serves", "Fix: take the directory from verify: {plugin-dir} in its arguments or $DPKIT_PLUGIN_DIR", "--private-mount"}},
		{"inside", fake("--plugin-dir", "{plugin-dir}", "--registration", "registry", "--registry-dir", "{plugin-dir}"),
			[]string{"/device-plugins/example_com_foo-", "but did not call Register on ", "/device-plugins/kubelet.sock. Fix: once the socket serves, call Register"}},
		{"none", []string{"sleep", "60"},
			[]string{"the plugin listens on no unix socket. Fix: serve the device plugin API on a socket in the directory verify hands down ({plugin-dir} in its arguments or $DPKIT_PLUGIN_DIR)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(tt.command...)
			cfg.RegisterTimeout = 5 * time.Second
			rep := run(t, cfg)
			if got := failed(rep); !slices.Equal(got, []string{verify.CheckServing}) {
				t.Fatalf("failed checks %v, want [%s]", got, verify.CheckServing)
			}
			d := rep.Result(verify.CheckServing).Detail
			for _, w := range append([]string{"no Register call arrived: none within 5s; "}, tt.want...) {
				if !strings.Contains(d, w) {
					t.Errorf("%s detail lacks %q:\n%s", verify.CheckServing, w, d)
				}
			}
		})
	}
}

// Config.Progress gets every check once, with the result the report
// gives, and gets the first ones while the plugin still runs: the results
// come as they are decided, not all at the end.
func TestProgress(t *testing.T) {
	t.Parallel()
	pidFile := filepath.Join(t.TempDir(), "pid")
	cfg := testConfig("sh", "-c", `echo $$ > `+pidFile+`; exec "$0" "$@"`,
		bins.dpkit, "plugin", "--config", "../../examples/fake.yaml", "--plugin-dir", "{plugin-dir}", "--registration", "kubelet")
	var got []verify.Result
	runningAtFirst := false
	cfg.Progress = func(res verify.Result) {
		if len(got) == 0 {
			pid, err := os.ReadFile(pidFile)
			if err != nil {
				t.Errorf("first result: %v", err)
			}
			_, err = os.Stat(filepath.Join("/proc", strings.TrimSpace(string(pid))))
			runningAtFirst = err == nil
		}
		got = append(got, res)
	}
	rep := run(t, cfg)
	if !runningAtFirst {
		t.Errorf("the first result (%s) came after the plugin had exited", got[0].ID)
	}
	if len(got) != len(rep.Results) {
		t.Fatalf("Progress got %d results, want one per check (%d)", len(got), len(rep.Results))
	}
	byID := map[string]verify.Result{}
	for _, res := range got {
		if _, dup := byID[res.ID]; dup {
			t.Errorf("Progress got %s twice", res.ID)
		}
		byID[res.ID] = res
	}
	for _, want := range rep.Results {
		if byID[want.ID] != want {
			t.Errorf("Progress got %+v, the report has %+v", byID[want.ID], want)
		}
	}
}

// The JSON report gives the duration in seconds and, for a check that
// failed, its fix and the link to its section; it reads back the same.
func TestReportJSON(t *testing.T) {
	t.Parallel()
	rep := run(t, testConfig("sh", "-c", "exit 3"))
	rep.Duration = 1500 * time.Millisecond
	data, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Duration any `json:"duration"`
		Results  []struct {
			ID, Fix, Docs string
		} `json:"results"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.Duration != 1.5 {
		t.Errorf("duration %v in JSON, want 1.5 (seconds)", raw.Duration)
	}
	serving := verify.Checks()[0]
	if r := raw.Results[0]; r.ID != serving.ID || r.Fix != serving.Fix || r.Docs != serving.DocsURL() {
		t.Errorf("failed check in JSON: %+v, want the fix %q and the link %s", r, serving.Fix, serving.DocsURL())
	}
	if r := raw.Results[1]; r.Fix != "" || r.Docs != "" {
		t.Errorf("skipped check %s has a fix or link in JSON: %+v", r.ID, r)
	}
	var back verify.Report
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if back.Duration != rep.Duration || !slices.Equal(back.Results, rep.Results) {
		t.Errorf("read back: duration %s, results %+v; want %s, %+v", back.Duration, back.Results, rep.Duration, rep.Results)
	}
}
