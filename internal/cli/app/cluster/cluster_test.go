package cluster

import (
	"bytes"
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dpkit/dpkit/internal/cli"
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

// TestPodHealth: the allocatedResourcesStatus of containers and init
// containers, by container, resource and ID; a pod without status has
// none; a pod the API server does not have is nil.
func TestPodHealth(t *testing.T) {
	t.Parallel()
	getHealth := PodHealth(fake.NewClientset(
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"},
			Status: corev1.PodStatus{
				InitContainerStatuses: []corev1.ContainerStatus{{Name: "side", AllocatedResourcesStatus: []corev1.ResourceStatus{
					{Name: "example.com/foo", Resources: []corev1.ResourceHealth{{ResourceID: "s0", Health: corev1.ResourceHealthStatusUnknown}}},
				}}},
				ContainerStatuses: []corev1.ContainerStatus{{Name: "app", AllocatedResourcesStatus: []corev1.ResourceStatus{
					{Name: "example.com/foo", Resources: []corev1.ResourceHealth{{ResourceID: "d0", Health: corev1.ResourceHealthStatusHealthy}, {ResourceID: "d1", Health: corev1.ResourceHealthStatusUnhealthy}}},
				}}},
			},
		},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bare"}},
	))
	h, err := getHealth(context.Background(), "ns", "p")
	want := cli.DeviceHealth{
		"side": {"example.com/foo": {"s0": "Unknown"}},
		"app":  {"example.com/foo": {"d0": "Healthy", "d1": "Unhealthy"}},
	}
	if err != nil || !reflect.DeepEqual(h, want) {
		t.Errorf("a pod with device health: %v, %v; want %v", h, err, want)
	}
	if h, err := getHealth(context.Background(), "ns", "bare"); err != nil || h == nil || len(h) != 0 {
		t.Errorf("a pod without status: %v, %v; want empty health", h, err)
	}
	if h, err := getHealth(context.Background(), "ns", "gone"); err != nil || h != nil {
		t.Errorf("a pod the API server does not have: %v, %v; want nil, nil", h, err)
	}
	if _, err := (kubeClients{}).PodHealth("/no/such/kubeconfig"); err == nil || !strings.Contains(err.Error(), "/no/such/kubeconfig") {
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
