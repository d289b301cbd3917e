package get

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/cli"
)

// TestPodsKubeconfigMissing checks that "get pods --kubeconfig" with a
// file that does not exist is a usage error naming the flag, before any
// socket is dialled.
func TestPodsKubeconfigMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out bytes.Buffer
	cmd := NewCommand(&cli.Env{In: strings.NewReader(""), Out: &out, Err: &out, Logger: slog.New(slog.DiscardHandler)})
	cmd.SetArgs([]string{"pods", "--root", dir, "--kubeconfig", filepath.Join(dir, "nope")})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "--kubeconfig "+filepath.Join(dir, "nope")+": the file does not exist") {
		t.Errorf("err = %v (exit %d), want exit 2 naming --kubeconfig", err, cli.ExitCode(err))
	}
}
