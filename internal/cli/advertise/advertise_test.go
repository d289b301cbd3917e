package advertise

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/pkg/extresource"
)

// TestUsageErrors checks what the command rejects before it talks to any
// cluster: exit code 2 and every problem in the bulleted field-path list,
// each named by its flag or argument.
func TestUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: dongle\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wrongCase := filepath.Join(t.TempDir(), "case.yaml")
	if err := os.WriteFile(wrongCase, []byte("apiVersion: dpkit.io/v1alpha1\nkind: ExtendedResources\nresources:\n- name: example.com/x\n  quantitY: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envNodeName, "")
	// No cluster configuration anywhere: the last case fails on it.
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"no node", []string{"example.com/dongle=1"}, []string{"1 problem(s)", "--node: Required value", envNodeName}},
		{"nothing to do", []string{"--node", "n"}, []string{"args: Required value: nothing to do"}},
		{"bad name", []string{"--node", "n", "dongle=1"}, []string{"args[0].name", "domain-qualified"}},
		{"reserved name", []string{"--node", "n", "kubernetes.io/x=1"}, []string{"reserved"}},
		{"requests prefix", []string{"--node", "n", "requests.example.com/x=1"}, []string{`"requests."`}},
		{"negative", []string{"--node", "n", "example.com/x=-1"}, []string{"args[0].quantity", "0 or more"}},
		{"fraction", []string{"--node", "n", "example.com/x=0.5"}, []string{"whole number"}},
		{"bad remove", []string{"--node", "n", "--remove", "x"}, []string{"--remove[0]"}},
		{"set and remove", []string{"--node", "n", "example.com/x=1", "--remove", "example.com/x"}, []string{`--remove[0]: Invalid value: "example.com/x": is both set and removed`}},
		{"remove with watch", []string{"--node", "n", "-f", bad, "--watch", "--remove", "example.com/x"}, []string{"--remove: Forbidden: cannot be used with --watch"}},
		{"remove-on-exit alone", []string{"--node", "n", "example.com/x=1", "--remove-on-exit"}, []string{"--remove-on-exit: Forbidden: needs --watch"}},
		{"dry run with watch", []string{"--node", "n", "example.com/x=1", "--watch", "--dry-run"}, []string{"--dry-run: Forbidden: cannot be used with --watch"}},
		{"qps", []string{"--node", "n", "example.com/x=1", "--qps", "0"}, []string{"--qps: Invalid value: 0: must be more than 0"}},
		{"every problem at once", []string{"dongle=1", "--qps", "0", "--burst", "0", "--remove-on-exit"}, []string{
			"5 problem(s):\n  - args[0].name", "\n  - --node: Required value", "\n  - --remove-on-exit", "\n  - --qps", "\n  - --burst",
		}},
		{"bad file", []string{"--node", "n", "-f", bad}, []string{"--file " + bad + ":\n1 problem(s):\n  - resources[0].name"}},
		{"bad file with --watch", []string{"--node", "n", "-f", bad, "--watch"}, []string{"--file " + bad, "resources[0].name"}},
		{"file in the wrong case", []string{"--node", "n", "-f", wrongCase}, []string{`resources[0].quantitY: Not found: unknown field; did you mean "quantity"? (field names are case-sensitive)`}},
		{"missing file", []string{"--node", "n", "-f", bad + ".gone"}, []string{"the file does not exist"}},
		{"no cluster configuration", []string{"--node", "n", "example.com/x=1"}, []string{"no cluster configuration found: give --kubeconfig FILE or set $KUBECONFIG"}},
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

// TestResultOutput checks what the one-shot command prints in each -o
// format.
func TestResultOutput(t *testing.T) {
	t.Parallel()
	four, two := resource.MustParse("4"), resource.MustParse("2")
	changed := newResult("w1", extresource.Change{
		Set:     corev1.ResourceList{"example.com/dongle": four, "example.com/a": two},
		Removed: []corev1.ResourceName{"example.com/gone"},
	})
	same := newResult("w1", extresource.Change{})
	for _, tc := range []struct {
		name, format string
		r            result
		want         string
	}{
		{"table", output.Table, changed, "node/w1: set example.com/a=2\nnode/w1: set example.com/dongle=4\nnode/w1: removed example.com/gone\n"},
		{"table unchanged", output.Table, same, "node/w1: unchanged\n"},
		{"json", output.JSON, changed, `{
  "node": "w1",
  "changed": true,
  "set": {
    "example.com/a": "2",
    "example.com/dongle": "4"
  },
  "removed": [
    "example.com/gone"
  ]
}
`},
		{"yaml unchanged", output.YAML, same, "changed: false\nnode: w1\nremoved: []\nset: {}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := output.Write(&b, tc.format, tc.r, tc.r.table); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("printed\n%s\nwant\n%s", b.String(), tc.want)
			}
		})
	}
}
