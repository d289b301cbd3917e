package cluster

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dpkit/dpkit/internal/cli/app"
)

// TestRunHasTheClusterCommands checks that dpkit-cluster runs node and
// advertise itself: their own flags, not the stand-ins' help.
func TestRunHasTheClusterCommands(t *testing.T) {
	t.Parallel()
	for cmd, flag := range map[string]string{"node": "--backend", "advertise": "--remove-on-exit"} {
		var out bytes.Buffer
		if err := Run(context.Background(), []string{cmd, "--help"}, strings.NewReader(""), &out, &out); err != nil {
			t.Fatalf("dpkit-cluster %s --help: %v", cmd, err)
		}
		if !strings.Contains(out.String(), flag) || strings.Contains(out.String(), "This command is in the dpkit-cluster binary") {
			t.Errorf("dpkit-cluster %s --help is not the real command's:\n%s", cmd, out.String())
		}
	}
}

func TestPodGetter(t *testing.T) {
	t.Parallel()
	getPod := PodGetter(fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}))
	pod, err := getPod(context.Background(), "ns", "p")
	if err != nil || pod == nil || pod.Name != "p" {
		t.Errorf("an existing pod: %v, %v", pod, err)
	}
	pod, err = getPod(context.Background(), "ns", "gone")
	if err != nil || pod != nil {
		t.Errorf("a pod the API server does not have: %v, %v; want nil, nil", pod, err)
	}
	if _, err := (kubeClients{}).PodGetter("/no/such/kubeconfig"); err == nil || !strings.Contains(err.Error(), "/no/such/kubeconfig") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}

// TestGetPodsKubeconfigMissing checks that "get pods --kubeconfig" with a
// file that does not exist is a usage error naming the flag, before any
// socket is dialled.
func TestGetPodsKubeconfigMissing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out bytes.Buffer
	err := Run(context.Background(), []string{"get", "pods", "--root", dir, "--kubeconfig", filepath.Join(dir, "nope")}, strings.NewReader(""), &out, &out)
	if app.ExitCode(err) != 2 || !strings.Contains(err.Error(), "--kubeconfig "+filepath.Join(dir, "nope")+": the file does not exist") {
		t.Errorf("err = %v (exit %d), want exit 2 naming --kubeconfig", err, app.ExitCode(err))
	}
}
