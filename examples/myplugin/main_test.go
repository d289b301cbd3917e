package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

const readme = "../../README.md"

// readmeBlock returns the body of the first fenced block of language lang
// in the README's section whose heading starts with heading.
func readmeBlock(t *testing.T, heading, lang string) string {
	t.Helper()
	data, err := os.ReadFile(readme)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## "+heading)
	if !ok {
		t.Fatalf("README has no section %q", "## "+heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "\n```"+lang+"\n")
	if !ok {
		t.Fatalf("README section %q has no ```%s block", heading, lang)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatalf("README section %q: the ```%s block does not end", heading, lang)
	}
	return block + "\n"
}

const section = "A device plugin in"

// The README shows this file verbatim.
func TestREADMEShowsThisFile(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	if shown := readmeBlock(t, section, "go"); shown != string(file) {
		t.Errorf("the README's plugin (section %q) differs from examples/myplugin/main.go; copy the file into the README.\n--- README\n+++ main.go\n%s",
			section, lineDiff(shown, string(file)))
	}
}

// The README's plugin, built from the README's text, passes every check of
// the verify command the README gives, run the way the README says: from
// a directory that holds ./myplugin. As root, it runs a second time as the
// unprivileged user nobody.
func TestREADMEVerify(t *testing.T) {
	t.Parallel()
	commands := strings.Split(strings.TrimSpace(readmeBlock(t, section, "sh")), "\n")
	const build, dpkit = "go build -o myplugin ./examples/myplugin", "go run ./cmd/dpkit "
	if len(commands) != 2 || commands[0] != build || !strings.HasPrefix(commands[1], dpkit) {
		t.Fatalf("the README's commands are\n%s\nwant %q, then %q with the verify arguments; update this test with them",
			strings.Join(commands, "\n"), build, dpkit+"...")
	}
	verifyArgs := strings.Fields(strings.TrimPrefix(commands[1], dpkit))

	dir := worldReadableTempDir(t)
	src := filepath.Join(dir, "src", "main.go")
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src, []byte(readmeBlock(t, section, "go")), 0o644); err != nil {
		t.Fatal(err)
	}
	// The plugin as "go build -o myplugin" leaves it in the working
	// directory; built from the README's text with this module's
	// dependencies.
	goBuild(t, filepath.Join(dir, "myplugin"), src)
	bin := filepath.Join(dir, "dpkit")
	goBuild(t, bin, "../../cmd/dpkit")

	run := func(t *testing.T, cred *syscall.Credential, home string) {
		cmd := exec.Command(bin, verifyArgs...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "HOME="+home, "NO_COLOR=1")
		if cred != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil || !strings.Contains(out.String(), " 0 failed") {
			t.Fatalf("dpkit %s: %v, want no check to fail\n%s", strings.Join(verifyArgs, " "), err, out.String())
		}
		t.Logf("dpkit %s:\n%s", strings.Join(verifyArgs, " "), out.String())
	}
	t.Run("as this user", func(t *testing.T) {
		t.Parallel()
		run(t, nil, os.Getenv("HOME"))
	})
	t.Run("as nobody", func(t *testing.T) {
		t.Parallel()
		if os.Geteuid() != 0 {
			t.Skipf("the test runs as uid %d, not root: it cannot run verify as another user, and the run above was the unprivileged one", os.Geteuid())
		}
		home := filepath.Join(dir, "home")
		if err := os.Mkdir(home, 0o700); err != nil {
			t.Fatal(err)
		}
		const nobody = 65534
		if err := os.Chown(home, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		run(t, &syscall.Credential{Uid: nobody, Gid: nobody}, home)
	})
}

// worldReadableTempDir returns a temporary directory that other users can
// read and search (t.TempDir's is private), removed when the test ends.
func worldReadableTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "myplugin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func goBuild(t *testing.T, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go build %s: %v\n%s", pkg, err, b)
		}
		t.Fatal(err)
	}
}

// lineDiff is a line diff of a and b (longest common subsequence): lines
// only in a start with "-", only in b with "+", and two common lines on
// each side of a change with " "; "@@ line N" gives the line in b.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	// lcs[i][j] is the LCS length of x[i:] and y[j:].
	lcs := make([][]int, len(x)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(y)+1)
	}
	for i := len(x) - 1; i >= 0; i-- {
		for j := len(y) - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		mark byte
		line string
		at   int // line number in b
	}
	var ops []op
	i, j := 0, 0
	for i < len(x) || j < len(y) {
		switch {
		case i < len(x) && j < len(y) && x[i] == y[j]:
			ops = append(ops, op{' ', x[i], j + 1})
			i, j = i+1, j+1
		case i < len(x) && (j == len(y) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, op{'-', x[i], j + 1})
			i++
		default:
			ops = append(ops, op{'+', y[j], j + 1})
			j++
		}
	}
	const context = 2
	var out strings.Builder
	last := -1 // index of the last op written
	for k, o := range ops {
		near := false
		for d := max(k-context, 0); d <= min(k+context, len(ops)-1); d++ {
			near = near || ops[d].mark != ' '
		}
		if !near {
			continue
		}
		if k != last+1 {
			fmt.Fprintf(&out, "@@ line %d\n", o.at)
		}
		fmt.Fprintf(&out, "%c%s\n", o.mark, o.line)
		last = k
	}
	return out.String()
}
