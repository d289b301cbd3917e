package up

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/cli"
)

// TestHostRoot checks --host-root: the plugins read below its sys/, dev/
// and proc/ (TestPluginDocsTryIt in internal/cli/app runs it on the
// fixtures), and a tree that is no host is a usage error naming the flag.
func TestHostRoot(t *testing.T) {
	t.Parallel()
	host := t.TempDir()
	if err := os.Mkdir(filepath.Join(host, "sys"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig("", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := setHostRoot(cfg, host); err != nil {
		t.Fatal(err)
	}
	if cfg.Host.SysfsRoot != filepath.Join(host, "sys") || cfg.Host.DevRoot != filepath.Join(host, "dev") || cfg.Host.ProcRoot != filepath.Join(host, "proc") {
		t.Errorf("host roots %+v, want %s/{sys,dev,proc}", cfg.Host, host)
	}

	empty := t.TempDir()
	file := filepath.Join(empty, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"missing": filepath.Join(empty, "gone"), "a file": file, "no sys or dev": empty} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := &cli.Env{In: strings.NewReader(""), Out: io.Discard, Err: io.Discard, Logger: slog.New(slog.DiscardHandler)}
			cmd := NewCommand(env)
			cmd.SetArgs([]string{"--host-root", dir})
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.ExecuteContext(context.Background())
			if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "--host-root "+dir) || !strings.Contains(err.Error(), "pkg/discovery/testdata/hosts/dgx-h100") {
				t.Errorf("--host-root %s: %v (exit %d), want a usage error naming the flag and an example", dir, err, cli.ExitCode(err))
			}
		})
	}
}
