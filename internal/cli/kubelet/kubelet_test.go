package kubelet

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// records is a slog handler that hands every record to a channel.
type records chan slog.Record

func (r records) Enabled(context.Context, slog.Level) bool { return true }
func (r records) Handle(_ context.Context, rec slog.Record) error {
	select {
	case r <- rec:
	default: // nobody reads any more
	}
	return nil
}
func (r records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r records) WithGroup(string) slog.Handler      { return r }

func execute(ctx context.Context, env *cli.Env, args ...string) error {
	cmd := NewCommand(env)
	cmd.SetArgs(args)
	var discard bytes.Buffer
	cmd.SetOut(&discard)
	cmd.SetErr(&discard)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

// TestNUMANodesFromSysfs runs "dpkit kubelet" with a topology policy and
// no --numa-nodes: the NUMA nodes are read from --sysfs-root. The root is
// recorded for the client commands.
func TestNUMANodesFromSysfs(t *testing.T) {
	sysfs := t.TempDir()
	for _, n := range []string{"node0", "node1"} {
		if err := os.MkdirAll(filepath.Join(sysfs, numa.NodesDir, n), 0o750); err != nil {
			t.Fatal(err)
		}
	}
	root := testdir.Short(t, "kb")
	state := t.TempDir()
	getenv := func(k string) string { return map[string]string{"XDG_STATE_HOME": state}[k] }
	logs := make(records, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- execute(ctx, &cli.Env{Logger: slog.New(logs), Getenv: getenv}, "--root", root, "--topology-policy", "single-numa-node", "--sysfs-root", sysfs)
	}()
	var nodes string
	for nodes == "" {
		select {
		case rec := <-logs:
			if rec.Message != "Emulated kubelet running" {
				continue
			}
			rec.Attrs(func(a slog.Attr) bool {
				if a.Key == "numaNodes" {
					nodes = a.Value.String()
				}
				return true
			})
		case err := <-done:
			cancel()
			t.Fatalf("dpkit kubelet ended: %v", err)
		}
	}
	// The root is recorded for the client commands before the emulator
	// says it runs.
	if r := emulator.ChooseRoot("", false, getenv); r.Dir != root || r.From != emulator.FromRecorded {
		t.Errorf("the root chosen without --root is %+v, want %s recorded by dpkit kubelet", r, root)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if nodes != "[0 1]" {
		t.Errorf("NUMA nodes %s, want [0 1] from %s", nodes, sysfs)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--topology-policy", "bogus"}, "use none, best-effort, restricted or single-numa-node"},
		{[]string{"--topology-scope", "node"}, "use container or pod"},
		{[]string{"--root", ""}, "--root must not be empty"},
	} {
		err := execute(context.Background(), &cli.Env{Logger: slog.New(slog.DiscardHandler)}, tc.args...)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("dpkit kubelet %v: %v (exit %d), want exit 2 and %q", tc.args, err, cli.ExitCode(err), tc.want)
		}
	}
}
