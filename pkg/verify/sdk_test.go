package verify_test

import (
	"strings"
	"testing"

	"github.com/dpkit/dpkit/pkg/verify"
)

// TestSDKPluginBugs runs the README's plugin with one bug each
// (testdata/sdkplugins, bugs plugins really have) through verify: the
// check aimed at the bug fails or warns, naming the devices, with the fix
// in the SDK's terms (verify knows the plugin is built on the SDK from the
// SDK's header), and no other check fails or warns.
func TestSDKPluginBugs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		plugin  string
		check   string
		verdict verify.Verdict
		detail  []string // the check's detail contains each
	}{
		{plugin: "allocate-fails", check: verify.CheckEveryDevice, verdict: verify.Fail,
			detail: []string{`Allocate failed for 1 of the 4 devices asked for alone: "dongle2" (Internal: allocate example.com/dongle devices [dongle2]: open /dev/dongle2: no such device)`,
				"Tried 4 of 4 healthy devices alone, 1 pair"}},
		{plugin: "partial-update", check: verify.CheckVanished, verdict: verify.Warn,
			detail: []string{"listed 1 device where the message before listed 4", `3 vanished ("dongle0", "dongle1", "dongle2")`}},
		{plugin: "duplicate-id", check: verify.CheckFirstMessage, verdict: verify.Warn,
			detail: []string{"the first message lists no devices", "the SDK's refusal of its list",
				`device ID \"dongle0\" is listed twice: devices[0] (healthy, NUMA nodes [0]) and devices[2] (healthy, NUMA nodes [1])`,
				`device ID \"dongle1\" is listed twice: devices[1] (healthy, NUMA nodes [0]) and devices[3] (healthy, NUMA nodes [1])`}},
		{plugin: "no-notify", check: verify.CheckFirstMessage, verdict: verify.Warn,
			detail: []string{"the first message lists no devices: the node advertises 0 example.com/dongle"}},
	}
	if len(tests) != len(sdkPlugins) {
		t.Fatalf("%d cases for the %d plugins under testdata/sdkplugins", len(tests), len(sdkPlugins))
	}
	infos := map[string]verify.CheckInfo{}
	for _, c := range verify.Checks() {
		infos[c.ID] = c
	}
	for _, tt := range tests {
		t.Run(tt.plugin, func(t *testing.T) {
			t.Parallel()
			rep := run(t, testConfig(bins.sdk[tt.plugin]))
			if !rep.SDK {
				t.Errorf("Report.SDK is false for a plugin built on the SDK")
			}
			res := rep.Result(tt.check)
			if res.Verdict != tt.verdict {
				t.Fatalf("%s: %s (%s), want %s", tt.check, res.Verdict, res.Detail, tt.verdict)
			}
			for _, want := range tt.detail {
				if !strings.Contains(res.Detail, want) {
					t.Errorf("%s detail lacks %q:\n%s", tt.check, want, res.Detail)
				}
			}
			if sdkFix := infos[tt.check].SDKFix; sdkFix == "" || res.Fix != sdkFix {
				t.Errorf("%s fix:\n\t%s\nwant the SDK's:\n\t%s", tt.check, res.Fix, sdkFix)
			}
			var others []string
			for _, r := range rep.Results {
				if r.ID != tt.check && (r.Verdict == verify.Fail || r.Verdict == verify.Warn) {
					others = append(others, r.ID+" "+string(r.Verdict))
				}
			}
			if len(others) > 0 {
				t.Errorf("other checks failed or warned: %v", others)
			}
		})
	}
}

// The README's plugin itself is an SDK plugin without these bugs: verify
// says it is built on the SDK, and the new checks pass.
func TestSDKPluginCorrect(t *testing.T) {
	t.Parallel()
	rep := run(t, testConfig(bins.myplugin))
	if !rep.SDK {
		t.Errorf("Report.SDK is false for examples/myplugin")
	}
	if got := append(failed(rep), warned(rep)...); len(got) > 0 {
		t.Errorf("failed or warned checks %v, want none", got)
	}
	for _, id := range []string{verify.CheckEveryDevice, verify.CheckFirstMessage} {
		if r := rep.Result(id); r.Verdict != verify.Pass {
			t.Errorf("%s: %s (%s), want pass", id, r.Verdict, r.Detail)
		}
	}
	if d := rep.Result(verify.CheckEveryDevice).Detail; !strings.Contains(d, "4 of 4 healthy devices alone, 2 pairs, all 4 in one request") {
		t.Errorf("%s detail %q does not say what was tried", verify.CheckEveryDevice, d)
	}
}
