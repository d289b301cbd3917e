package podspec

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestIsSidecar(t *testing.T) {
	t.Parallel()
	always, never := corev1.ContainerRestartPolicyAlways, corev1.ContainerRestartPolicy("Never")
	for _, tc := range []struct {
		name string
		c    corev1.Container
		want bool
	}{
		{"no restartPolicy: a plain init container", corev1.Container{}, false},
		{"restartPolicy Always: a sidecar", corev1.Container{RestartPolicy: &always}, true},
		{"another restartPolicy", corev1.Container{RestartPolicy: &never}, false},
	} {
		if got := IsSidecar(&tc.c); got != tc.want {
			t.Errorf("%s: IsSidecar = %v, want %v", tc.name, got, tc.want)
		}
	}
}
