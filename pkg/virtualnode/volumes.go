package virtualnode

import (
	"context"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// apiVolumes reads what pods' volumes show from the API server with the
// node's client: under node credentials the Node authorizer lets it read
// the ConfigMaps and Secrets of pods bound to the node and ask for their
// service accounts' tokens, as a kubelet does.
type apiVolumes struct{ client kubernetes.Interface }

var _ backend.VolumeSource = apiVolumes{}

// ConfigMap implements backend.VolumeSource; not found reads as the
// kubelet's configmap manager says it (`configmap "x" not found`).
func (a apiVolumes) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	cm, err := a.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(corev1.Resource("configmap"), name)
	}
	return cm, err
}

// Secret implements backend.VolumeSource (`secret "x" not found`).
func (a apiVolumes) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	s, err := a.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(corev1.Resource("secret"), name)
	}
	return s, err
}

// ServiceAccountToken implements backend.VolumeSource.
func (a apiVolumes) ServiceAccountToken(ctx context.Context, namespace, serviceAccount string, req *authenticationv1.TokenRequest) (*authenticationv1.TokenRequest, error) {
	return a.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount, req, metav1.CreateOptions{})
}
