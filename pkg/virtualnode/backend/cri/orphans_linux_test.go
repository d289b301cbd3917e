package cri

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// TestCleanupOrphans: what a pod the backend does not run and the API
// server does not know left under the pod and log directories goes, its
// tmpfs volumes unmounted (as root); the pods it runs, those it is
// removing and those the API server knows keep theirs.
func TestCleanupOrphans(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
	defer b.Close()
	pod := testPod("kept", corev1.RestartPolicyNever, corev1.Container{Name: "app", Image: "busybox:1"})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	dirs := map[string]bool{ // path: kept
		filepath.Join(b.cfg.PodDir, "uid-gone", "volumes", "kubernetes.io~secret", "s"):   false,
		filepath.Join(b.cfg.LogDir, "ns_gone_uid-gone", "app"):                            false,
		filepath.Join(b.cfg.PodDir, "uid-api", "volumes", "kubernetes.io~empty-dir", "e"): true,
		filepath.Join(b.cfg.LogDir, "ns_api_uid-api", "app"):                              true,
		filepath.Join(b.cfg.PodDir, string(pod.UID), "containers", "app"):                 true,
		filepath.Join(b.cfg.LogDir, "ns_leaving_uid-leaving"):                             true,
	}
	for d := range dirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	secret := filepath.Join(b.cfg.PodDir, "uid-gone", "volumes", "kubernetes.io~secret", "s")
	mounted := os.Getuid() == 0 && unix.Mount("tmpfs", secret, "tmpfs", 0, "") == nil
	if mounted {
		t.Cleanup(func() { _ = unix.Unmount(secret, unix.MNT_DETACH) })
	}
	b.mu.Lock()
	b.forgetting["uid-leaving"] = true
	b.mu.Unlock()
	if err := b.CleanupOrphans(context.Background(), func(uid types.UID) bool { return uid == "uid-api" }); err != nil {
		t.Fatal(err)
	}
	for d, kept := range dirs {
		if _, err := os.Stat(d); (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v (err %v)", d, err == nil, kept, err)
		}
	}
	// A directory still mounted could not have been removed.
	for _, d := range []string{filepath.Join(b.cfg.PodDir, "uid-gone"), filepath.Join(b.cfg.LogDir, "ns_gone_uid-gone")} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s is still there", d)
		}
	}
}
