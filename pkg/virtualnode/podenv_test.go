package virtualnode

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// givenBackend records the pods a backend is given.
type givenBackend struct {
	backend.Backend
	mu    sync.Mutex
	given []*corev1.Pod
}

func (b *givenBackend) CreatePod(ctx context.Context, pod *corev1.Pod) error {
	b.mu.Lock()
	b.given = append(b.given, pod.DeepCopy())
	b.mu.Unlock()
	return b.Backend.CreatePod(ctx, pod)
}

// secretPods returns a pod as the API server has it, with Secret
// references, and as virtual-kubelet hands it to the provider, resolved.
func secretPods() (api, resolved *corev1.Pod) {
	ref := &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "token"}}
	api = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: "ns", UID: "uid-creds"},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			InitContainers: []corev1.Container{{Name: "init", Env: []corev1.EnvVar{{Name: "TOK", ValueFrom: ref}}}},
			Containers: []corev1.Container{{
				Name:    "app",
				Env:     []corev1.EnvVar{{Name: "TOK", ValueFrom: ref}, {Name: "X", Value: "x$(TOK)"}},
				EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}}},
			}},
		},
	}
	resolved = api.DeepCopy()
	resolved.Spec.InitContainers[0].Env = []corev1.EnvVar{{Name: "TOK", Value: "s3cret-token"}}
	resolved.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "PASSWORD", Value: "s3cret-pw"}, {Name: "TOK", Value: "s3cret-token"}, {Name: "X", Value: "xs3cret-token"}}
	resolved.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{}
	return api, resolved
}

func assertNoSecrets(t *testing.T, what string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "s3cret") {
		t.Errorf("%s holds a Secret's value: %s", what, b)
	}
}

// TestProviderKeepsResolvedEnvInMemory: the pod virtual-kubelet resolved
// reaches the backend and the node API with its env as the API server has
// it; the resolved values reach the containers through containerEnv only.
// After a restart (a fresh provider adopting the backend's pods) a
// container waits for them until virtual-kubelet offers the pod again.
func TestProviderKeepsResolvedEnvInMemory(t *testing.T) {
	ctx, host, p := startProvider(t, testdir.Short(t, "vnp"))
	be := &givenBackend{Backend: sim.New(sim.Config{Config: backend.Config{Notify: p.backendNotify}})}
	p.be = be
	api, resolved := secretPods()
	p.api.Store(&apiView{apiPod: func(ns, name string) *corev1.Pod {
		if ns == api.Namespace && name == api.Name {
			return api
		}
		return nil
	}})
	if err := p.CreatePod(ctx, resolved.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	if len(be.given) != 1 {
		t.Fatalf("backend given %d pods", len(be.given))
	}
	assertNoSecrets(t, "the pod given to the backend", be.given[0])
	if got := be.given[0].Spec.Containers[0]; len(got.EnvFrom) != 1 || got.Env[0].ValueFrom == nil || got.Env[1].Value != "x$(TOK)" {
		t.Errorf("backend's container env %+v envFrom %+v, want the API server's", got.Env, got.EnvFrom)
	}
	pods, _ := p.GetPods(ctx)
	assertNoSecrets(t, "GetPods (the node API's /pods)", pods)
	stored, _ := p.GetPod(ctx, "ns", "creds")
	assertNoSecrets(t, "GetPod", stored)

	for _, c := range []struct {
		name string
		want []corev1.EnvVar
	}{
		{"init", resolved.Spec.InitContainers[0].Env},
		{"app", resolved.Spec.Containers[0].Env},
	} {
		env, err := p.containerEnv(ctx, stored, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if len(env) != len(c.want) {
			t.Fatalf("%s: containerEnv %v, want %v", c.name, env, c.want)
		}
		for i := range env {
			if env[i] != c.want[i] {
				t.Fatalf("%s: containerEnv %v, want %v", c.name, env, c.want)
			}
		}
	}

	// A pod the API server no longer has when it arrives: no env kept.
	gone := resolved.DeepCopy()
	gone.Name, gone.UID = "gone", "uid-gone"
	if err := p.CreatePod(ctx, gone); err != nil {
		t.Fatal(err)
	}
	assertNoSecrets(t, "a pod missing from the API server", be.given[1])

	// Restart: a fresh provider adopts the stored pods.
	p2 := newProvider(slog.New(slog.DiscardHandler), host)
	p2.be = be
	p2.adopt(pods)
	got := make(chan []corev1.EnvVar, 1)
	go func() {
		env, _ := p2.containerEnv(ctx, stored, "app")
		got <- env
	}()
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := p2.containerEnv(short, stored, "app"); err == nil {
		t.Fatal("containerEnv answered before the pod was resolved again")
	}
	if err := p2.UpdatePod(ctx, resolved.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	select {
	case env := <-got:
		if len(env) != 3 || env[0].Value != "s3cret-pw" {
			t.Fatalf("containerEnv after the restart: %v", env)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("containerEnv still waiting 10s after virtual-kubelet offered the pod again")
	}

	// Gone from the API server: forgotten, resolved values included.
	p2.api.Store(&apiView{inAPI: func(string, string, types.UID) bool { return false }})
	if err := p2.DeletePod(ctx, stored); err != nil {
		t.Fatal(err)
	}
	p2.envs.mu.Lock()
	left := len(p2.envs.pods)
	p2.envs.mu.Unlock()
	if left != 0 {
		t.Errorf("the environment of %d pods kept after they were forgotten", left)
	}
}
