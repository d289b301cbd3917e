package differential

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/testdir"
)

// waitTimeout bounds every wait for a state; a side that does not reach
// it within this time is reported with the last state it showed.
const waitTimeout = 10 * time.Second

// timedOut starts an observation line of a wait that did not end in the
// expected state.
const timedOut = "TIMEOUT"

// scenario is a sequence of steps run against both device managers.
type scenario struct {
	name  string
	steps []step
	// args are extra flags for both device manager programs, such as a
	// topology policy.
	args []string
}

// step does one thing on one side and returns what it observed, one
// string per line. An error is a failure of the harness, not a
// difference.
type step struct {
	what string
	do   func(s *side) ([]string, error)
}

// side is one device manager (kubelet's or dpkit's) with its plugins and
// pods.
type side struct {
	name        string
	bin         string
	args        []string
	root        string
	pluginDir   string
	registryDir string
	kubeletSock string
	log         *slog.Logger
	logFile     *os.File

	mgr     *manager
	gen     int
	plugins map[string]plugin
	order   []string // plugin names in start order
	stopped map[string]bool
	live    []podSpec
	mark    time.Time // when the last plugin stop was asked for
	regMark map[string]float64

	// Checkpoint writes that device lists cause (checkpoint_test.go).
	writes        *writeCounter
	writesBase    int
	pendingWrites int
}

func newSide(name, bin, root string) (*side, error) {
	s := &side{
		name: name, bin: bin, root: root,
		pluginDir:   filepath.Join(root, "device-plugins"),
		registryDir: filepath.Join(root, "plugins_registry"),
		plugins:     map[string]plugin{},
		stopped:     map[string]bool{},
		regMark:     map[string]float64{},
	}
	s.kubeletSock = filepath.Join(s.pluginDir, "kubelet.sock")
	for _, d := range []string{s.pluginDir, s.registryDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return nil, err
		}
	}
	w, err := newWriteCounter(s.pluginDir)
	if err != nil {
		return nil, err
	}
	s.writes = w
	f, err := os.Create(filepath.Join(root, "plugins.log"))
	if err != nil {
		w.close()
		return nil, err
	}
	s.logFile = f
	s.log = slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return s, nil
}

// close stops every plugin and the manager.
func (s *side) close() {
	for _, n := range s.order {
		s.plugins[n].stop()
	}
	if s.mgr != nil {
		select {
		case <-s.mgr.done:
		default:
			_ = s.mgr.stop(syscall.SIGTERM)
		}
	}
	s.writes.close()
	_ = s.logFile.Close()
}

func (s *side) startManager() error {
	if s.gen > 0 {
		// The plugins that register again by themselves each send their
		// list, and the new manager writes the checkpoint for it.
		s.writesBase, _ = s.writes.count()
		s.pendingWrites = s.reregistering()
	}
	args := append([]string{"--plugin-dir", s.pluginDir, "--registry-dir", s.registryDir, "-v", "4"}, s.args...)
	if len(s.live) > 0 {
		data, err := json.Marshal(s.live)
		if err != nil {
			return err
		}
		p := filepath.Join(s.root, "pods.json")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return err
		}
		args = append(args, "--pods", p)
	}
	m, err := startManager(s.bin, filepath.Join(s.root, fmt.Sprintf("manager-%d.log", s.gen)), args...)
	if err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	s.gen++
	s.mgr = m
	return nil
}

// stopManager stops the manager with sig and checks that it exited
// cleanly (SIGTERM) and without a data race report.
func (s *side) stopManager(sig syscall.Signal) error {
	err := s.mgr.stop(sig)
	if s.mgr.raced() {
		return fmt.Errorf("%s: the race detector reported a data race; see %s", s.name, s.mgr.logPath)
	}
	if err != nil {
		return fmt.Errorf("%s: stopped with %v: %w; see %s", s.name, sig, err, s.mgr.logPath)
	}
	return nil
}

// stoppedEndpoint matches the kubelet's "endpoint %v has been stopped",
// which prints its endpoint struct: a mutex, the resource, the socket, a
// client pointer and the stop time.
var stoppedEndpoint = regexp.MustCompile(`endpoint &\{\{\{\} \{\d+ \d+\}\} (\S+) .*\} has been stopped`)

// normalise replaces the side's directory, the only thing that must
// differ between the sides, with <root>, and the kubelet's dump of a
// stopped endpoint (a pointer and a time) with the resource it names,
// which is what dpkit prints.
func (s *side) normalise(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		l = strings.ReplaceAll(l, s.root, "<root>")
		out[i] = stoppedEndpoint.ReplaceAllString(l, "endpoint of $1 has been stopped")
	}
	return out
}

// drainCalls renders the calls every plugin saw since the last drain.
func (s *side) drainCalls() []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(s.plugins)) {
		for _, c := range s.plugins[n].calls() {
			out = append(out, n+": "+c)
		}
	}
	return out
}

func (s *side) setLive(spec podSpec, live bool) {
	s.live = slices.DeleteFunc(s.live, func(p podSpec) bool { return p.Name == spec.Name })
	if live {
		s.live = append(s.live, spec)
	}
}

// runScenario runs sc on both sides, step by step, and compares what
// they observe after each step.
func runScenario(t *testing.T, sc scenario, upstreamBin, dpkitBin string) {
	dir := testdir.Short(t, "diff")
	var sides [2]*side
	for i, def := range []struct{ name, bin, sub string }{{"upstream", upstreamBin, "u"}, {"dpkit", dpkitBin, "d"}} {
		s, err := newSide(def.name, def.bin, filepath.Join(dir, def.sub))
		if err != nil {
			t.Fatal(err)
		}
		s.args = sc.args
		sides[i] = s
	}
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, s := range sides {
			wg.Add(1)
			go func() { defer wg.Done(); s.close() }()
		}
		wg.Wait()
		if t.Failed() {
			for _, s := range sides {
				logTails(t, s)
			}
		}
	})

	steps := append(append([]step{kubeletStarts()}, sc.steps...), kubeletStops())
	expected := deliberateFor(sc.name)
	for i, st := range steps {
		var obs [2][]string
		var errs [2]error
		var wg sync.WaitGroup
		for j, s := range sides {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lines, err := st.do(s)
				obs[j], errs[j] = s.normalise(lines), err
			}()
		}
		wg.Wait()
		if err := errors.Join(errs[0], errs[1]); err != nil {
			t.Fatalf("step %d (%s): %v", i, st.what, err)
		}
		up, dp := obs[0], obs[1]
		d, listed := expected[st.what]
		if !listed || !slices.Equal(up, d.upstream) {
			for _, l := range up {
				if strings.HasPrefix(l, timedOut) {
					t.Errorf("step %d (%s): the kubelet's device manager never reached the state the scenario expects; fix the scenario:\n%s", i, st.what, strings.Join(up, "\n"))
					return
				}
			}
		}
		switch {
		case slices.Equal(up, dp) && listed:
			t.Errorf("step %d (%s): deliberate difference %s (%s) is no longer seen: both sides observe\n  %s\nRemove it from the deliberate table and docs/device-manager.md.",
				i, st.what, d.issue, d.summary, strings.Join(up, "\n  "))
		case slices.Equal(up, dp):
			t.Logf("step %d (%s): same%s", i, st.what, indent(up))
		case listed && slices.Equal(up, d.upstream) && slices.Equal(dp, d.dpkit):
			t.Logf("step %d (%s): deliberate difference %s (%s)\nkubelet v1.37:%s\ndpkit:%s", i, st.what, d.issue, d.summary, indent(up), indent(dp))
			if d.diverges {
				t.Logf("the sides differ from here on; the scenario ends")
				return
			}
		default:
			t.Errorf("step %d (%s): the device managers differ\nkubelet v1.37:%s\ndpkit:%s", i, st.what, indent(up), indent(dp))
			return
		}
	}
}

func indent(lines []string) string {
	if len(lines) == 0 {
		return " (nothing)"
	}
	return "\n  " + strings.Join(lines, "\n  ")
}

func logTails(t *testing.T, s *side) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(s.root, "*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		const max = 6 << 10
		if len(data) > max {
			data = data[len(data)-max:]
		}
		t.Logf("%s %s (tail):\n%s", s.name, filepath.Base(f), data)
	}
}
