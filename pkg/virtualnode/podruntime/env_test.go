package podruntime

import (
	"context"
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestAddContainerEnv(t *testing.T) {
	t.Parallel()
	c := &corev1.Container{Name: "app", Env: []corev1.EnvVar{
		{Name: "A", Value: "a"},
		{Name: "B", Value: "$(A)-b"},
		{Name: "S", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "k"}}},
		{Name: "A", Value: "again"},
	}}
	resolve := func(_ context.Context, _ *corev1.Pod, container string) ([]corev1.EnvVar, error) {
		if container != "app" {
			t.Errorf("resolve asked for %q", container)
		}
		return []corev1.EnvVar{{Name: "S", Value: "secret"}, {Name: "SKIP", Value: "x"}, {Name: "B", Value: "device"}}, nil
	}
	var env Env
	env.Set("HOSTNAME", "p")
	if err := env.AddContainerEnv(context.Background(), &corev1.Pod{}, c, resolve, func(n string) bool { return n == "SKIP" }); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range env.Names() {
		got = append(got, k+"="+env.Get(k))
	}
	want := []string{"HOSTNAME=p", "A=again", "B=device", "S=secret"}
	if !slices.Equal(got, want) {
		t.Errorf("env %q, want %q", got, want)
	}
	if args := env.Expand([]string{"$(B)", "$$(A)", "$(NONE)"}); !slices.Equal(args, []string{"device", "$(A)", "$(NONE)"}) {
		t.Errorf("Expand = %q", args)
	}
	if env.Expand(nil) != nil {
		t.Error("Expand(nil) is not nil")
	}
	boom := errors.New("boom")
	fail := func(context.Context, *corev1.Pod, string) ([]corev1.EnvVar, error) { return nil, boom }
	if err := new(Env).AddContainerEnv(context.Background(), &corev1.Pod{}, c, fail, nil); !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
}
