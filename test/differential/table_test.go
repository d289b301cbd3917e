package differential

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/repopath"
)

// TestScenarioTable checks the suite itself without running it (so also
// under -short): unique short names, unique step descriptions (the
// deliberate table refers to them), every deliberate difference pointing
// at a real step, and docs/device-manager.md listing the scenario count
// and the deliberate table.
func TestScenarioTable(t *testing.T) {
	scs := scenarios()
	names := map[string]map[string]bool{}
	for _, sc := range scs {
		if names[sc.name] != nil {
			t.Errorf("scenario %q listed twice", sc.name)
		}
		// TestDifferential/<name> becomes a temporary directory name;
		// the sockets below it must stay under 108 bytes.
		if len(sc.name) > 24 {
			t.Errorf("scenario name %q is longer than 24 characters", sc.name)
		}
		steps := map[string]bool{}
		for _, st := range sc.steps {
			steps[st.what] = true
		}
		names[sc.name] = steps
	}
	for _, d := range deliberate {
		steps, ok := names[d.scenario]
		switch {
		case !ok:
			t.Errorf("deliberate difference %s names no scenario %q", d.issue, d.scenario)
		case !steps[d.step]:
			t.Errorf("deliberate difference %s: scenario %q has no step %q", d.issue, d.scenario, d.step)
		}
		if !regexp.MustCompile(`^kubernetes#\d+$`).MatchString(d.issue) {
			t.Errorf("deliberate difference in %s: issue %q is not kubernetes#N", d.scenario, d.issue)
		}
	}

	data, err := os.ReadFile(repopath.Find(filepath.Join("docs", "device-manager.md")))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i := strings.Index(doc, "## Differential suite")
	if i < 0 {
		t.Fatal(`docs/device-manager.md has no "## Differential suite" section`)
	}
	section := doc[i:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	if want := fmt.Sprintf("%d scenarios", len(scs)); !strings.Contains(section, want) {
		t.Errorf("the Differential suite section does not say %q", want)
	}
	for _, sc := range scs {
		if !strings.Contains(section, "`"+sc.name+"`") {
			t.Errorf("the Differential suite section does not list scenario `%s`", sc.name)
		}
	}
	for _, d := range deliberate {
		if !strings.Contains(section, d.issue) || !strings.Contains(section, "`"+d.scenario+"`") {
			t.Errorf("the Differential suite section does not list %s (`%s`)", d.issue, d.scenario)
		}
	}
}
