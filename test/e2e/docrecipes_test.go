package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/internal/repopath"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/test/controlplane"
)

// A recipe is a sh block of the README or a page of docs/ that a newcomer
// pastes: the block right after a line `<!-- recipe: NAME -->`. The test
// runs it as a script, as it is written: bash -euo pipefail, from the
// repository root, on the test control plane (the exports hack/cluster.sh
// prints: $KUBECONFIG, $CLIENT_CA, kubectl v1.37.0 on $PATH), dpkit and
// dpkit-cluster built and on $PATH as `make build` and the README's
// install step put them. A line that ends in `# => TEXT` promises that its
// output contains TEXT. Background jobs are stopped when the recipe ends,
// whatever it did.
type recipe struct {
	page, name string
	line       int
	body       []string
}

const recipeMarker = "<!-- recipe: "

// docRecipes reads every recipe of README.md and docs/*.md.
func docRecipes(t *testing.T) []recipe {
	t.Helper()
	root := filepath.Dir(repopath.Find("go.mod"))
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join(root, "README.md")}, pages...)
	var out []recipe
	for _, p := range pages {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			name, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), recipeMarker)
			if !ok {
				continue
			}
			r := recipe{page: filepath.Base(p), name: strings.TrimSuffix(name, " -->"), line: i + 1}
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "```sh") {
				t.Fatalf("%s:%d: recipe %q: the next line must open a ```sh block", r.page, r.line, r.name)
			}
			for i += 2; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
				r.body = append(r.body, lines[i])
			}
			out = append(out, r)
		}
	}
	return out
}

// script is the recipe as bash runs it: each `# => TEXT` promise checked.
func (r recipe) script() string {
	var b strings.Builder
	b.WriteString("set -euo pipefail\n")
	var cont string
	for n, line := range r.body {
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			cont += rest + " "
			continue
		}
		line, cont = cont+line, ""
		cmd, want, ok := strings.Cut(line, "# => ")
		if !ok {
			b.WriteString(line + "\n")
			continue
		}
		want = strings.TrimSpace(want)
		fmt.Fprintf(&b, "out=$(%s 2>&1) || { echo \"$out\"; echo 'recipe line %d failed: %s' >&2; exit 1; }\necho \"$out\"\n",
			strings.TrimSpace(cmd), n+1, shellQuoteLess(strings.TrimSpace(cmd)))
		fmt.Fprintf(&b, "case \"$out\" in *%s*) ;; *) echo 'recipe line %d: the output does not contain %s' >&2; exit 1 ;; esac\n",
			shellQuote(want), n+1, shellQuoteLess(want))
	}
	return b.String()
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shellQuoteLess makes s safe inside a single-quoted message.
func shellQuoteLess(s string) string { return strings.ReplaceAll(s, "'", `"`) }

// TestDocRecipes runs every recipe of the docs on the test control plane,
// one after another, each failing its subtest when its page drifts from
// what dpkit does (a command, a file it names, an output it promises).
// Each runs twice: as a script (bash, stdin closed) and as typed in an
// interactive shell (bash -i on a terminal: job control, background jobs
// in process groups of their own, which stop on reading the terminal).
func TestDocRecipes(t *testing.T) {
	recipes := docRecipes(t)
	if len(recipes) == 0 {
		t.Fatal("no recipes in README.md and docs/")
	}
	if _, err := exec.LookPath("script"); err != nil {
		t.Fatalf("script (util-linux) runs the recipes on a terminal: %v", err)
	}
	// As hack/cluster.sh starts it: kube-controller-manager releases the
	// claims and empties the namespaces the recipes delete.
	cp := controlplane.StartForTest(t, controlplane.Options{Scheduler: true, ControllerManager: true})
	if cp.Kubectl == "" {
		t.Fatalf("no kubectl beside the control plane: run bash hack/build-controlplane.sh")
	}
	bin := filepath.Dir(dpkitBinary(t))
	root := filepath.Dir(repopath.Find("go.mod"))
	for _, r := range recipes {
		for _, interactive := range []bool{false, true} {
			shell := map[bool]string{false: "script", true: "interactive"}[interactive]
			t.Run(strings.TrimSuffix(r.page, ".md")+"/"+r.name+"/"+shell, func(t *testing.T) {
				ctx := testContext(t)
				// Short: dpkit verify --dra serves the driver's
				// sockets below it, within a unix socket path's 107
				// bytes.
				tmp := testdir.Short(t, "r")
				env := append(os.Environ(),
					"KUBECONFIG="+cp.Kubeconfig, "CLIENT_CA="+cp.ClientCAFile,
					"PATH="+bin+string(os.PathListSeparator)+filepath.Dir(cp.Kubectl)+string(os.PathListSeparator)+os.Getenv("PATH"),
					"TMPDIR="+tmp)
				before := topEntries(t, root)
				out, err := runRecipe(ctx, t.TempDir(), r.script(), root, env, interactive)
				if err != nil {
					t.Errorf("%s:%d recipe %q (%s): %v\n%s\nThe cluster then:\n%s", r.page, r.line, r.name, shell, err, out, clusterState(cp.Kubectl, env))
				}
				// What the recipe built in the checkout (README's
				// ./myplugin) goes, as the user's own clean-up would.
				for name := range topEntries(t, root) {
					if !before[name] {
						if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
							t.Error(err)
						}
					}
				}
			})
		}
	}
}

// clusterState is what a failed recipe left in the cluster: pods and the
// nodes they are on, claims and their allocations, the latest events.
func clusterState(kubectl string, env []string) string {
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "nodes,pods,resourceclaims,resourceslices", "-A", "-o", "wide"},
		{"get", "resourceclaims", "-A", "-o", "custom-columns=NAME:.metadata.name,DELETING:.metadata.deletionTimestamp,RESERVED:.status.reservedFor[*].name,DEVICES:.status.allocation.devices.results[*].device,CONSUMED:.status.allocation.devices.results[*].consumedCapacity"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		cmd := exec.Command(kubectl, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(&b, "$ kubectl %s (%v)\n%s\n", strings.Join(args, " "), err, strings.Join(lines, "\n"))
	}
	return b.String()
}

// topEntries are the names in dir.
func topEntries(t *testing.T, dir string) map[string]bool {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

// runRecipe runs script from a file in work, with bash, in a session of
// its own: stdin closed, or typed into an interactive shell on a terminal
// (script -c "bash -i", the file as its input). Then it stops what the recipe left running, in
// whatever process group: SIGTERM to every process of the sessions, SIGKILL
// to what is still there 10 s later.
func runRecipe(ctx context.Context, work, script, dir string, env []string, interactive bool) (string, error) {
	file, sidFile := filepath.Join(work, "recipe.sh"), filepath.Join(work, "session")
	// The shell records its session: an interactive one runs in the
	// terminal's session, not in the one made for script.
	prelude := `read -r -a _dpkit_stat < /proc/$$/stat && echo "${_dpkit_stat[5]}" > ` + shellQuote(sidFile) + "\n"
	if err := os.WriteFile(file, []byte(prelude+script), 0o600); err != nil {
		return "", err
	}
	// A file, not a pipe: the jobs the recipe leaves running hold their
	// output open, and Wait would wait for them.
	out, err := os.Create(filepath.Join(work, "output"))
	if err != nil {
		return "", err
	}
	defer out.Close()
	cmd := exec.Command("bash", file)
	if interactive {
		// Typed, line by line, into an interactive shell on a terminal:
		// a job a line starts with & is numbered as the user sees it
		// (bash -i FILE would number every command), and a job that
		// reads the terminal is stopped, as it would be.
		if err := os.WriteFile(file, []byte(prelude+script+"exit 0\n"), 0o600); err != nil {
			return "", err
		}
		in, err := os.Open(file)
		if err != nil {
			return "", err
		}
		defer in.Close()
		cmd = exec.Command("script", "-qec", "bash --noprofile --norc -i", "/dev/null")
		cmd.Stdin = in
	}
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	sessions := []int{cmd.Process.Pid}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if b, readErr := os.ReadFile(sidFile); readErr == nil {
		var sid int
		if _, scanErr := fmt.Sscan(string(b), &sid); scanErr == nil && sid > 1 {
			sessions = append(sessions, sid)
		}
	}
	if stopErr := stopSessions(sessions); stopErr != nil {
		err = errors.Join(err, stopErr)
	}
	if ctx.Err() != nil {
		<-done
	}
	b, readErr := os.ReadFile(out.Name())
	return string(b), errors.Join(err, readErr)
}

// stopSessions ends every process of the sessions: SIGTERM, then SIGKILL
// after 10 s, and waits until none is left.
func stopSessions(sids []int) error {
	deadline := time.Now().Add(10 * time.Second)
	signalled, killed := false, false
	for {
		pids := sessionProcesses(sids)
		if len(pids) == 0 {
			break
		}
		switch {
		case !signalled:
			signalled = true
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGTERM)
			}
		case !killed && time.Now().After(deadline):
			killed = true
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
		time.Sleep(50 * time.Millisecond) // other processes' exit: nothing to wait on
	}
	if killed {
		return fmt.Errorf("processes of the recipe still ran 10 s after SIGTERM")
	}
	return nil
}

// sessionProcesses lists the live processes (not zombies) of the sessions.
func sessionProcesses(sids []int) []int {
	var out []int
	for _, pid := range procfs.PIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && !st.Exited() && slices.Contains(sids, st.Session()) {
			out = append(out, pid)
		}
	}
	return out
}

// TestDocRecipesParsed: the recipe reader finds the recipes the pages
// mark, and a promise is checked.
func TestDocRecipesParsed(t *testing.T) {
	t.Parallel()
	recipes := docRecipes(t)
	seen := map[string]bool{}
	for _, r := range recipes {
		seen[r.page] = true
	}
	for _, page := range []string{"README.md", "dpkit-up.md", "virtual-node.md", "dra.md", "dra-plugins.md", "exporter.md", "verify.md"} {
		if !seen[page] {
			t.Errorf("%s has no recipe (<!-- recipe: NAME --> before a ```sh block)", page)
		}
	}
	r := recipe{body: []string{"echo hello \\", "  world   # => lo wo"}}
	if script := r.script(); !strings.Contains(script, "*'lo wo'*") || !strings.Contains(script, "echo hello    world") {
		t.Errorf("script %q does not join the lines and check the promise", script)
	}
}
