package virtualnode

import (
	"context"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestAPIVolumes: the node reads ConfigMaps and Secrets from the API
// server, and a missing one reads as the kubelet's managers say it
// (`configmap "x" not found`, what FailedMount events carry); tokens are
// asked for from the service account's token subresource.
func TestAPIVolumes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := fake.NewClientset(
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg", Namespace: "ns"}, Data: map[string]string{"k": "v"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec", Namespace: "ns"}, Data: map[string][]byte{"p": []byte("w")}},
	)
	var tokenFor string
	c.PrependReactor("create", "serviceaccounts", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ca := a.(k8stesting.CreateAction)
		if a.GetSubresource() != "token" {
			return false, nil, nil
		}
		tokenFor = a.GetNamespace() + "/" + ca.(k8stesting.CreateActionImpl).Name
		tr := ca.GetObject().(*authenticationv1.TokenRequest).DeepCopy()
		tr.Status.Token = "jwt"
		return true, tr, nil
	})
	v := apiVolumes{c}
	if cm, err := v.ConfigMap(ctx, "ns", "cfg"); err != nil || cm.Data["k"] != "v" {
		t.Errorf("ConfigMap: %v %v", cm, err)
	}
	if s, err := v.Secret(ctx, "ns", "sec"); err != nil || string(s.Data["p"]) != "w" {
		t.Errorf("Secret: %v %v", s, err)
	}
	for _, tc := range []struct {
		get  func() error
		want string
	}{
		{func() error { _, err := v.ConfigMap(ctx, "ns", "absent"); return err }, `configmap "absent" not found`},
		{func() error { _, err := v.Secret(ctx, "ns", "absent"); return err }, `secret "absent" not found`},
	} {
		if err := tc.get(); !apierrors.IsNotFound(err) || err.Error() != tc.want {
			t.Errorf("error %v, want not found reading %q", err, tc.want)
		}
	}
	tr, err := v.ServiceAccountToken(ctx, "ns", "robot", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"a"}}})
	if err != nil || tr.Status.Token != "jwt" || tokenFor != "ns/robot" {
		t.Errorf("token %v %v for %q, want jwt for ns/robot", tr, err, tokenFor)
	}
}
