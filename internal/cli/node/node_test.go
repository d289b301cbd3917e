package node_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/internal/cli/app"
	"github.com/dpkit/dpkit/internal/cli/app/cluster"
)

// TestUsageErrors checks what "dpkit node" refuses before it registers
// anything: exit 2, every flag problem in the bulleted field-path list, and
// a missing cluster configuration named with the ways to give one.
func TestUsageErrors(t *testing.T) {
	// No cluster configuration anywhere.
	t.Setenv("KUBECONFIG", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	root := t.TempDir()
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"every flag problem at once", []string{"node", "--backend", "docker", "--count", "0", "--cpu", "lots", "--taint", "x"}, []string{
			"error: 6 problem(s):\n  - --name: Required value: name the node\n  - --root: Required value",
			"\n  - --backend: Unsupported value: \"docker\": supported values: \"process\", \"sim\", \"cri\"",
			"\n  - --count: Invalid value: 0: must be at least 1",
			"\n  - --cpu: Invalid value: \"lots\"",
			"\n  - --taint[0]: Invalid value: \"x\"",
		}},
		{"cri without a runtime endpoint", []string{"node", "--name", "vn", "--root", root, "--backend", "cri"}, []string{
			"error: 1 problem(s):\n  - --cri-endpoint: Required value: the cri backend needs the container runtime's socket, e.g. unix:///run/containerd/containerd.sock",
		}},
		{"a runtime endpoint without cri", []string{"node", "--name", "vn", "--root", root, "--cri-endpoint", "unix:///run/containerd/containerd.sock"}, []string{
			"\n  - --cri-endpoint: Invalid value: \"unix:///run/containerd/containerd.sock\": only the cri backend uses a container runtime: add --backend cri, or leave --cri-endpoint out",
		}},
		{"no cluster configuration", []string{"node", "--name", "vn", "--root", root, "--port", "-1"}, []string{
			"error: no cluster configuration found: give --kubeconfig FILE or set $KUBECONFIG ($KUBECONFIG is not set;",
		}},
		{"a --kubeconfig that does not exist", []string{"node", "--name", "vn", "--root", root, "--port", "-1", "--kubeconfig", root + "/nope"}, []string{
			"error: --kubeconfig " + root + "/nope: the file does not exist",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := cluster.Run(context.Background(), tc.args, strings.NewReader(""), &out, &errOut)
			if code := app.ExitCode(err); code != 2 {
				t.Fatalf("exit %d (%v), want 2", code, err)
			}
			msg := "error: " + err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("%s\ndoes not contain\n%s", msg, w)
				}
			}
			if out.Len() != 0 {
				t.Errorf("printed %q on a usage error", out.String())
			}
		})
	}
}
