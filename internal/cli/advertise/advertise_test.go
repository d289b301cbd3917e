package advertise

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/cli"
)

// TestUsageErrors checks what the command rejects before it talks to any
// cluster: exit code 2 and a message that names the problem.
func TestUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: dongle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envNodeName, "")
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"no node", []string{"example.com/dongle=1"}, []string{"--node is required", envNodeName}},
		{"nothing to do", []string{"--node", "n"}, []string{"nothing to do"}},
		{"bad name", []string{"--node", "n", "dongle=1"}, []string{"args[0].name", "domain-qualified"}},
		{"reserved name", []string{"--node", "n", "kubernetes.io/x=1"}, []string{"reserved"}},
		{"requests prefix", []string{"--node", "n", "requests.example.com/x=1"}, []string{`"requests."`}},
		{"negative", []string{"--node", "n", "example.com/x=-1"}, []string{"args[0].quantity", "0 or more"}},
		{"fraction", []string{"--node", "n", "example.com/x=0.5"}, []string{"whole number"}},
		{"bad remove", []string{"--node", "n", "--remove", "x"}, []string{"--remove[0]"}},
		{"set and remove", []string{"--node", "n", "example.com/x=1", "--remove", "example.com/x"}, []string{"both set and removed"}},
		{"remove with watch", []string{"--node", "n", "-f", bad, "--watch", "--remove", "example.com/x"}, []string{"--remove cannot be used with --watch"}},
		{"remove-on-exit alone", []string{"--node", "n", "example.com/x=1", "--remove-on-exit"}, []string{"--remove-on-exit needs --watch"}},
		{"dry run with watch", []string{"--node", "n", "example.com/x=1", "--watch", "--dry-run"}, []string{"--dry-run cannot be used with --watch"}},
		{"qps", []string{"--node", "n", "example.com/x=1", "--qps", "0"}, []string{"--qps"}},
		{"bad file", []string{"--node", "n", "-f", bad}, []string{bad, "resources[0].name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			env := &cli.Env{In: strings.NewReader(""), Out: &out, Err: &errOut, Logger: slog.New(slog.DiscardHandler)}
			cmd := NewCommand(env)
			cmd.SetArgs(tt.args)
			cmd.SetOut(&out)
			cmd.SetErr(&errOut)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.ExecuteContext(context.Background())
			if code := cli.ExitCode(err); code != 2 {
				t.Fatalf("exit code %d (%v), want 2", code, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if out.Len() != 0 {
				t.Errorf("printed %q on a usage error", out.String())
			}
		})
	}
}
