package app

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/pluginrun"
)

// fakeClusterBinary writes a dpkit-cluster stand-in, a shell script, and
// returns its path.
func fakeClusterBinary(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), ClusterBinary)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o700); err != nil {
		t.Fatal(err)
	}
	return p
}

// withLookPath makes Run find dpkit-cluster at path.
func withLookPath(path string, err error) Option {
	return func(o *options) { o.lookPath = func() (string, error) { return path, err } }
}

// noLookPath fails the test if Run looks for dpkit-cluster.
func noLookPath(t *testing.T) Option {
	return func(o *options) {
		o.lookPath = func() (string, error) {
			t.Error("dpkit-cluster was looked for")
			return "", errors.New("not expected")
		}
	}
}

func run(t *testing.T, args []string, opts ...Option) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = Run(context.Background(), args, strings.NewReader(""), &out, &errOut, opts...)
	return out.String(), errOut.String(), err
}

// TestClusterCommandsRunDpkitCluster checks that dpkit hands node,
// advertise, and get, kubelet and up with --kubeconfig to dpkit-cluster with their arguments,
// and passes its output and exit status on.
func TestClusterCommandsRunDpkitCluster(t *testing.T) {
	t.Parallel()
	echo := fakeClusterBinary(t, `echo "$*"`+"\n")
	root := t.TempDir()
	tests := []struct {
		name string
		args []string
		want string // dpkit-cluster's arguments
	}{
		{"node", []string{"node", "--kubeconfig", "k.conf", "--name", "vn1"}, "node --kubeconfig k.conf --name vn1"},
		{"verify --dra: the whole command line", []string{"verify", "--dra", "--kubeconfig", "k.conf", "--", "my-driver", "-v"}, "verify --dra --kubeconfig k.conf -- my-driver -v"},
		{"node --help", []string{"node", "--help"}, "node --help"},
		{"advertise with a global flag first", []string{"--log-level", "debug", "advertise", "--node", "n1", "example.com/x=1"},
			"advertise --log-level debug --node n1 example.com/x=1"},
		{"get --kubeconfig: the whole command line", []string{"get", "pods", "--root", root, "--kubeconfig", "k.conf", "-o", "json"},
			"get pods --root " + root + " --kubeconfig k.conf -o json"},
		{"get claims --kubeconfig", []string{"get", "claims", "--kubeconfig", "k.conf"}, "get claims --kubeconfig k.conf"},
		{"kubelet --kubeconfig", []string{"kubelet", "--root", root, "--kubeconfig", "k.conf"}, "kubelet --root " + root + " --kubeconfig k.conf"},
		{"up --kubeconfig", []string{"up", "--kubeconfig", "k.conf"}, "up --kubeconfig k.conf"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, _, err := run(t, tc.args, withLookPath(echo, nil))
			if err != nil {
				t.Fatalf("dpkit %v: %v", tc.args, err)
			}
			if got := strings.TrimSpace(out); got != tc.want {
				t.Errorf("dpkit %v ran dpkit-cluster %q, want %q", tc.args, got, tc.want)
			}
		})
	}
}

func TestClusterExitStatus(t *testing.T) {
	t.Parallel()
	failing := fakeClusterBinary(t, "echo 'error: no node n1' >&2\nexit 3\n")
	_, stderr, err := run(t, []string{"advertise", "--node", "n1"}, withLookPath(failing, nil))
	if ExitCode(err) != 3 || !Reported(err) {
		t.Errorf("err %v: exit code %d, reported %t; want dpkit-cluster's 3, already reported", err, ExitCode(err), Reported(err))
	}
	if stderr != "error: no node n1\n" {
		t.Errorf("stderr %q, want dpkit-cluster's", stderr)
	}
}

func TestClusterBinaryMissing(t *testing.T) {
	t.Parallel()
	_, _, err := run(t, []string{"node", "--name", "vn1"}, withLookPath("", errors.New("no dpkit-cluster in /x or on PATH")))
	if err == nil || ExitCode(err) != 1 || Reported(err) {
		t.Fatalf("err %v (exit %d, reported %t), want an exit 1 error of dpkit's own", err, ExitCode(err), Reported(err))
	}
	for _, want := range []string{"dpkit node needs dpkit-cluster", "no dpkit-cluster in /x or on PATH",
		`"go install ./cmd/..."`, "make build", "go run ./cmd/dpkit-cluster node"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestClusterSignal checks that stopping dpkit asks dpkit-cluster to stop
// (SIGTERM), waits for it and exits as it did: 0 when it stopped cleanly,
// 128+15 when the signal killed it.
func TestClusterSignal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, script string
		wantLine     string
		wantCode     int
	}{
		// The shell runs its trap between two short sleeps, so that no
		// child of it outlives it.
		{"stops cleanly", "trap 'echo stopped; exit 0' TERM\necho ready\nwhile :; do sleep 0.1 </dev/null >/dev/null 2>&1; done\n", "stopped", 0},
		{"killed by the signal", "echo ready\nexec sleep 86399\n", "", 128 + 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bin := fakeClusterBinary(t, tc.script)
			pr, pw := io.Pipe()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() {
				err := Run(ctx, []string{"node"}, strings.NewReader(""), pw, io.Discard, withLookPath(bin, nil))
				_ = pw.Close()
				done <- err
			}()
			sc := bufio.NewScanner(pr)
			if !sc.Scan() || sc.Text() != "ready" {
				t.Fatalf("dpkit-cluster did not start: %q", sc.Text())
			}
			cancel()
			var rest []string
			for sc.Scan() {
				rest = append(rest, sc.Text())
			}
			if got := strings.Join(rest, "\n"); got != tc.wantLine {
				t.Errorf("dpkit-cluster printed %q after the signal, want %q", got, tc.wantLine)
			}
			if err := <-done; ExitCode(err) != tc.wantCode {
				t.Errorf("Run returned %v (exit %d), want exit %d", err, ExitCode(err), tc.wantCode)
			}
		})
	}
}

// TestGetWithoutKubeconfigStays checks that get runs in dpkit unless
// --kubeconfig asks for the API server.
func TestGetWithoutKubeconfigStays(t *testing.T) {
	t.Parallel()
	_, _, err := run(t, []string{"get", "pods", "--root", t.TempDir()}, noLookPath(t))
	if err == nil || !strings.Contains(err.Error(), "PodResources API") {
		t.Errorf("get pods on an empty root: %v, want dpkit's own error about the PodResources API", err)
	}
}

type fakeCluster struct{ err error }

func (f fakeCluster) PodHealth(string) (cli.PodHealthGetter, error) { return nil, f.err }

func (fakeCluster) DRAFront() pluginrun.DRAFront { return nil }

func (f fakeCluster) DRA(string) (cli.DRAReader, error) { return nil, f.err }

// TestClusterOptions checks what cmd/dpkit-cluster relies on: WithCommands
// replaces the stand-ins, and with WithCluster get --kubeconfig runs in
// process.
func TestClusterOptions(t *testing.T) {
	t.Parallel()
	fakeNode := func(env *cli.Env) *cobra.Command {
		return &cobra.Command{Use: "node", RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := io.WriteString(env.Out, "the real node\n")
			return err
		}}
	}
	out, _, err := run(t, []string{"node"}, noLookPath(t), WithCommands(fakeNode))
	if err != nil || out != "the real node\n" {
		t.Errorf("node with WithCommands: %q, %v; want the command given", out, err)
	}
	_, _, err = run(t, []string{"get", "pods", "--root", t.TempDir(), "--kubeconfig", "k.conf"}, noLookPath(t),
		WithCluster(fakeCluster{errors.New("no such kubeconfig")}))
	if err == nil || !strings.Contains(err.Error(), "no such kubeconfig") || ExitCode(err) != 2 {
		t.Errorf("get --kubeconfig with WithCluster: %v, want the cluster's error", err)
	}
	var names []string
	for _, c := range NewRootCommand(&cli.Env{}, WithCommands(fakeNode)).Commands() {
		names = append(names, c.Name())
	}
	if strings.Count(strings.Join(names, " "), "node") != 1 {
		t.Errorf("commands %v: want one node", names)
	}
}

func TestFindClusterBinary(t *testing.T) {
	t.Parallel()
	noPath := func(string) (string, error) { return "", errors.New("not on PATH") }
	write := func(dir string, mode os.FileMode) string {
		p := filepath.Join(dir, ClusterBinary)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}

	bin := t.TempDir()
	exe := filepath.Join(bin, "dpkit")
	want := write(bin, 0o755)
	if got, err := findClusterBinaryFrom(exe, noPath); err != nil || got != want {
		t.Errorf("next to dpkit: %q, %v; want %s", got, err, want)
	}

	// dpkit reached through a symlink (e.g. /usr/local/bin/dpkit -> the
	// install directory): dpkit-cluster next to the real file.
	linkDir := t.TempDir()
	link := filepath.Join(linkDir, "dpkit")
	if err := os.WriteFile(exe, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(exe, link); err != nil {
		t.Fatal(err)
	}
	if got, err := findClusterBinaryFrom(link, noPath); err != nil || got != want {
		t.Errorf("through a symlink: %q, %v; want %s", got, err, want)
	}

	// Not executable next to dpkit: PATH's.
	other := t.TempDir()
	write(other, 0o644)
	onPath := func(name string) (string, error) { return "/on/path/" + name, nil }
	if got, err := findClusterBinaryFrom(filepath.Join(other, "dpkit"), onPath); err != nil || got != "/on/path/dpkit-cluster" {
		t.Errorf("not executable next to dpkit: %q, %v; want PATH's", got, err)
	}

	empty := t.TempDir()
	_, err := findClusterBinaryFrom(filepath.Join(empty, "dpkit"), noPath)
	if err == nil || !strings.Contains(err.Error(), empty) || !strings.Contains(err.Error(), "on PATH") {
		t.Errorf("nowhere: %v, want an error naming %s and PATH", err, empty)
	}
}
