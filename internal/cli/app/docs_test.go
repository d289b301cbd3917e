package app

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/repopath"
	"github.com/dpkit/dpkit/pkg/deviceplugin/dptest"
)

// docCommand is a dpkit command line of a doc page, in a sh block, with
// the "ready:" line the page says it prints ("" for none).
type docCommand struct {
	page  string
	args  []string
	ready string
}

// docCommands returns the "go run ./cmd/dpkit VERB ..." lines of the sh
// blocks of page (continuation lines joined) whose verb is one of verbs,
// each with the first "ready:" line after it and before the next command.
func docCommands(t *testing.T, page string, verbs ...string) []docCommand {
	t.Helper()
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var (
		out    []docCommand
		inSh   bool
		joined string
	)
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(line, "```"):
			inSh = false
			continue
		}
		if strings.HasPrefix(line, "ready: ") && len(out) > 0 && out[len(out)-1].ready == "" {
			out[len(out)-1].ready = line
			continue
		}
		if !inSh {
			continue
		}
		if rest, ok := strings.CutSuffix(line, `\`); ok {
			joined += rest
			continue
		}
		line, joined = joined+line, ""
		args, ok := strings.CutPrefix(strings.TrimSpace(line), "go run ./cmd/dpkit ")
		if !ok {
			continue
		}
		fields := strings.Fields(args)
		for _, v := range verbs {
			if fields[0] == v {
				out = append(out, docCommand{page: filepath.Base(page), args: fields})
			}
		}
	}
	return out
}

// readyCounts parses "ready: a=1 b=2 allocatable".
func readyCounts(t *testing.T, line string) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for _, f := range strings.Fields(strings.TrimSuffix(strings.TrimPrefix(line, "ready: "), " allocatable")) {
		name, n, ok := strings.Cut(f, "=")
		v, err := strconv.Atoi(n)
		if !ok || err != nil {
			t.Fatalf("ready line %q: %q is not NAME=COUNT", line, f)
		}
		counts[name] = v
	}
	return counts
}

// inRepo makes the arguments that name a file or directory of the
// checkout absolute, as running from the checkout's root would see them.
func inRepo(root string, args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if _, err := os.Stat(filepath.Join(root, a)); err == nil && !strings.HasPrefix(a, "-") {
			out[i] = filepath.Join(root, a)
		}
	}
	return out
}

// TestPluginDocsTryIt runs the "try it without the hardware" commands of
// docs/plugins: each "dpkit up --host-root FIXTURE" must print the ready
// line its page shows, and each "dpkit plugin" on the same fixture must
// serve those devices to a kubelet.
func TestPluginDocsTryIt(t *testing.T) {
	t.Parallel()
	root := filepath.Dir(repopath.Find("go.mod"))
	pages, err := filepath.Glob(filepath.Join(root, "docs", "plugins", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/plugins pages: %v", err)
	}
	var ups, plugins []docCommand
	perPage := map[string]int{}
	for _, p := range pages {
		for _, c := range docCommands(t, p, "up", "plugin") {
			if c.args[0] == "up" {
				ups = append(ups, c)
				perPage[c.page]++
			} else {
				plugins = append(plugins, c)
			}
		}
	}
	for _, page := range []string{"generic.md", "amdgpu.md", "nvidia.md"} {
		if perPage[page] == 0 {
			t.Errorf("docs/plugins/%s shows no dpkit up command to try the plugin without its hardware", page)
		}
	}
	if len(plugins) == 0 {
		t.Error("docs/plugins shows no dpkit plugin command on a fixture")
	}

	// ready lines by config and host root, for the plugin commands.
	served := map[string]map[string]int{}
	for _, c := range ups {
		c := c
		if c.ready == "" {
			t.Errorf("%s: %q shows no ready line", c.page, strings.Join(c.args, " "))
			continue
		}
		flags := flagValues(c.args)
		served[flags["--config"]+" "+flags["--host-root"]] = readyCounts(t, c.ready)
		t.Run(c.page+" "+strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			if got := runUpUntilReady(t, inRepo(root, c.args)); got != c.ready {
				t.Errorf("dpkit %s printed\n  %s\nthe page shows\n  %s", strings.Join(c.args, " "), got, c.ready)
			}
		})
	}
	for _, c := range plugins {
		flags := flagValues(c.args)
		host := filepath.Dir(flags["--sysfs-root"])
		if filepath.Dir(flags["--dev-root"]) != host || filepath.Dir(flags["--proc-root"]) != host {
			t.Errorf("%s: %q: the roots are not one fixture's sys, dev and proc", c.page, strings.Join(c.args, " "))
			continue
		}
		want, ok := served[flags["--config"]+" "+host]
		if !ok {
			t.Errorf("%s: %q: no dpkit up command of the pages runs %s on %s to compare with", c.page, strings.Join(c.args, " "), flags["--config"], host)
			continue
		}
		t.Run(c.page+" "+strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			k := dptest.NewKubelet(t)
			args := inRepo(root, c.args)
			for i := range args {
				if args[i] == "--plugin-dir" && i+1 < len(args) {
					args[i+1] = k.PluginDir()
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- Run(ctx, args, strings.NewReader(""), io.Discard, io.Discard) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("dpkit %s: %v", strings.Join(c.args, " "), err)
				}
			}()
			for resource, n := range want {
				k.WaitForDevices(t, resource, dptest.Healthy(n))
			}
		})
	}
}

// flagValues maps each --flag of args to the word after it.
func flagValues(args []string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(args); i++ {
		if strings.HasPrefix(args[i], "--") {
			m[args[i]] = args[i+1]
		}
	}
	return m
}

// runUpUntilReady runs "dpkit args" (an up command line) in process until
// it prints its ready line, and returns that line.
func runUpUntilReady(t *testing.T, args []string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := Run(ctx, args, strings.NewReader(""), pw, io.Discard)
		_ = pw.Close()
		done <- err
	}()
	var seen []string
	ready := ""
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		seen = append(seen, sc.Text())
		if strings.HasPrefix(sc.Text(), "ready: ") {
			ready = sc.Text()
			break
		}
	}
	cancel()
	for sc.Scan() {
	}
	if err := <-done; err != nil || ready == "" {
		t.Errorf("dpkit %s: %v; output:\n%s", strings.Join(args, " "), err, strings.Join(seen, "\n"))
	}
	return ready
}
