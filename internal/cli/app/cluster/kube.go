package cluster

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/internal/cli"
	kubeconfigpkg "github.com/dpkit/dpkit/internal/kubeconfig"
)

// kubeClients is cli.Cluster through client-go.
type kubeClients struct{}

func (kubeClients) PodGetter(kubeconfig string) (cli.PodGetter, error) {
	rc, err := kubeconfigpkg.Load(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return PodGetter(client), nil
}

// PodGetter reads pods through client; a pod the API server does not
// have is nil, with no error.
func PodGetter(client kubernetes.Interface) cli.PodGetter {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return pod, err
	}
}
