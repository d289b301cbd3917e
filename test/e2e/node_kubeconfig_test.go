package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/testdir"
)

// TestVirtualNodeKubeconfigFromEnv runs the dpkit binary's "node" with no
// --kubeconfig flag, only $KUBECONFIG set (and a $HOME without
// ~/.kube/config), as a newcomer's shell would, and checks that the node
// joins the cluster and becomes Ready.
func TestVirtualNodeKubeconfigFromEnv(t *testing.T) {
	dpkitBinary(t) // before the test's deadline starts: a cold build takes minutes
	cp := cluster.Get(t)
	ctx := testContext(t)
	c := cp.Client()
	name := unique("vn-env")

	var env []string
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); k != "KUBECONFIG" && k != "HOME" && k != "KUBERNETES_SERVICE_HOST" {
			env = append(env, kv)
		}
	}
	env = append(env, "KUBECONFIG="+cp.Kubeconfig, "HOME="+t.TempDir())

	var logs bytes.Buffer
	cmd := exec.Command(dpkitBinary(t), "node", "--name", name, "--root", testdir.Short(t, "vn"), "--backend", "sim", "--port", "-1", "--node-ip", "127.0.0.1")
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("dpkit node output:\n%s", logs.String())
		}
	})

	poll(t, ctx, "node "+name+" registered and Ready", func(ctx context.Context) (bool, string, error) {
		select {
		case err := <-exited:
			if err == nil {
				err = errors.New("exit status 0")
			}
			return false, "", fmt.Errorf("dpkit node exited before its node was Ready: %w", err)
		default:
		}
		n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, fmt.Sprintf("Ready=%s", cond.Status), nil
			}
		}
		return false, "no Ready condition", nil
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if err != nil && (!errors.As(err, &ee) || ee.ExitCode() != 130) {
			t.Fatalf("dpkit node exited with %v after SIGTERM, want 0 or 130", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("dpkit node did not exit within a minute of SIGTERM")
	}
}
