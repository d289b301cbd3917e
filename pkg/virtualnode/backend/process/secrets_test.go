package process

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// TestStateFileMode: state.json is readable by its owner only, even where
// a leftover temporary file of a crashed run was group-readable.
func TestStateFileMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := newRecorder()
	b := newBackend(t, dir, rec)
	defer b.Close()
	pod := testPod("mode", corev1.RestartPolicyNever, nil, sh("app", "true"))
	podDir := filepath.Join(dir, string(pod.UID))
	if err := os.MkdirAll(podDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(podDir, "state.json.tmp"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Succeeded", phase(corev1.PodSucceeded))
	fi, err := os.Stat(filepath.Join(podDir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("state.json has mode %v, want -rw-------", fi.Mode().Perm())
	}
}

// TestWriteAtomicMode: the file written is its owner's only, whatever the
// mode of the file it replaces, and nothing else is left beside it.
func TestWriteAtomicMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeAtomic(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state.json %q with mode %v, want \"new\" with -rw-------", b, fi.Mode().Perm())
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("%d files beside state.json", len(entries)-1)
	}
}

// TestContainerEnvFromNode: a container gets the literal values of its
// env, not its references' empty values, then what ContainerEnv gives; a
// container waits for ContainerEnv, and stopping the pod ends the wait.
func TestContainerEnvFromNode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rec := newRecorder()
	release := make(chan struct{})
	asked := make(chan string, 4)
	b, err := New(Config{
		Config: backend.Config{
			Notify: rec.notify,
			ContainerEnv: func(ctx context.Context, pod *corev1.Pod, c string) ([]corev1.EnvVar, error) {
				asked <- pod.Name + "/" + c
				if pod.Name == "never" {
					<-ctx.Done()
					return nil, ctx.Err()
				}
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return []corev1.EnvVar{{Name: "TOKEN", Value: "resolved"}}, nil
			},
		},
		Dir: dir,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	app := sh("app", `echo "greeting=$GREETING token=$TOKEN unset=${UNSET-none}"`)
	ref := &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}
	app.Env = append(app.Env, corev1.EnvVar{Name: "TOKEN", ValueFrom: ref}, corev1.EnvVar{Name: "UNSET", ValueFrom: ref})
	pod := testPod("env", corev1.RestartPolicyNever, nil, app)
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if got := recvString(t, asked); got != "env/app" {
		t.Fatalf("ContainerEnv asked for %s", got)
	}
	if p := b.Pods()[0]; p.Status.ContainerStatuses[0].State.Waiting == nil {
		t.Fatalf("container not waiting for its environment: %+v", p.Status.ContainerStatuses[0].State)
	}
	close(release)
	rec.wait(t, pod.UID, "Succeeded", phase(corev1.PodSucceeded))
	if logs := readLogs(t, b, "env", "app", backend.LogOptions{Tail: -1}); !strings.Contains(logs, "greeting=hello token=resolved unset=none\n") {
		t.Fatalf("logs %q", logs)
	}

	never := testPod("never", corev1.RestartPolicyNever, nil, sh("app", "true"))
	if err := b.CreatePod(context.Background(), never); err != nil {
		t.Fatal(err)
	}
	recvString(t, asked)
	done := make(chan error, 1)
	go func() { done <- b.Forget(context.Background(), never) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("forgetting a pod whose container waits for its environment did not return within 20s")
	}
}

func recvString(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(20 * time.Second):
		t.Fatal("nothing received within 20s")
		return ""
	}
}
