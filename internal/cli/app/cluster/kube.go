package cluster

import (
	"context"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/drafront"
	kubeconfigpkg "github.com/dpkit/dpkit/internal/kubeconfig"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/pkg/verify"
	"github.com/dpkit/dpkit/pkg/verify/draverify"
)

// kubeClients is cli.Cluster through client-go.
type kubeClients struct{}

// DRAFront starts DRA fronts with API server clients.
func (kubeClients) DRAFront() pluginrun.DRAFront { return drafront.New() }

// VerifyDRA runs dpkit verify --dra (pkg/verify/draverify) against the
// API server of kubeconfig, found as every dpkit command finds it
// (internal/kubeconfig: --kubeconfig, $KUBECONFIG, ~/.kube/config,
// in-cluster).
func (kubeClients) VerifyDRA(ctx context.Context, kubeconfig string, cfg verify.DRAConfig) (*verify.Report, error) {
	rc, err := kubeconfigpkg.Load(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%s: verify --dra needs an API server: %w", kubeconfigpkg.Flag, err)
	}
	return draverify.Run(ctx, rc, cfg)
}

// CleanupDRA runs dpkit verify --dra --cleanup (pkg/verify/draverify).
func (kubeClients) CleanupDRA(ctx context.Context, kubeconfig string, cfg verify.DRACleanupConfig) (*verify.DRACleanupReport, error) {
	rc, err := kubeconfigpkg.Load(kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", kubeconfigpkg.Flag, err)
	}
	return draverify.Cleanup(ctx, rc, cfg)
}

func (kubeClients) PodHealth(kubeconfig string) (cli.PodHealthGetter, error) {
	rc, err := kubeconfigpkg.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return PodHealth(client), nil
}

// PodHealth reads pods' device health through client; a pod the API
// server does not have is nil, with no error.
func PodHealth(client kubernetes.Interface) cli.PodHealthGetter {
	return func(ctx context.Context, namespace, name string) (cli.DeviceHealth, error) {
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return deviceHealth(pod), nil
	}
}

// deviceHealth collects the allocatedResourcesStatus of pod's init
// containers and containers.
func deviceHealth(pod *corev1.Pod) cli.DeviceHealth {
	out := cli.DeviceHealth{}
	for _, cs := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		for _, rs := range cs.AllocatedResourcesStatus {
			if out[cs.Name] == nil {
				out[cs.Name] = map[string]map[string]string{}
			}
			h := map[string]string{}
			for _, r := range rs.Resources {
				h[string(r.ResourceID)] = string(r.Health)
			}
			out[cs.Name][string(rs.Name)] = h
		}
	}
	return out
}
