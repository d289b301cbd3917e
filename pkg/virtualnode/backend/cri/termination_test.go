package cri

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// TestTerminationMessageReadsOnlyItsFile: the termination message comes
// from the file the backend made for the run; a volume of the pod mounted
// at the same path with a planted link, a link in place of the file, a
// FIFO and a character device are never read through, and a large file
// gives its last 4 KiB.
func TestTerminationMessageReadsOnlyItsFile(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "containers", "app")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(root, "node-secret")
	if err := os.WriteFile(secret, []byte("node secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	volume := filepath.Join(root, "volumes", "empty-dir", "v")
	if err := os.MkdirAll(volume, 0o750); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(volume, "termination-log")
	if err := os.Symlink(secret, planted); err != nil {
		t.Fatal(err)
	}
	spec := &corev1.Container{Name: "app", TerminationMessagePath: "/dev/termination-log"}
	status := func(hostPaths ...string) *runtimeapi.ContainerStatus {
		s := &runtimeapi.ContainerStatus{ExitCode: 1}
		for _, p := range hostPaths {
			s.Mounts = append(s.Mounts, &runtimeapi.Mount{ContainerPath: "/dev/termination-log", HostPath: p})
		}
		return s
	}
	own := filepath.Join(dir, "0000abcd")
	if err := os.WriteFile(own, []byte("bye"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := terminationMessage(spec, status(planted, own), dir); got != "bye" {
		t.Errorf("with the pod's volume mounted first at the path: %q, want the run's own file %q", got, "bye")
	}

	link := filepath.Join(dir, "linked")
	if err := os.Symlink(secret, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"a link": link, "a FIFO": fifo, "a device": "/dev/zero"} {
		d := filepath.Dir(path)
		if got := terminationMessage(spec, status(path), d); strings.Contains(got, "node secret") || !strings.Contains(got, "Error on reading termination log") {
			t.Errorf("termination file that is %s: message %.80q, want an error and nothing read", name, got)
		}
	}

	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("x", 10000)+"END"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := terminationMessage(spec, status(big), dir); len(got) != podruntime.MaxTerminationMessageLength || !strings.HasSuffix(got, "END") {
		t.Errorf("a 10 KB file gave %d bytes ending %q, want its last %d", len(got), got[max(0, len(got)-3):], podruntime.MaxTerminationMessageLength)
	}
}

// TestTerminationFilesGoWithTheirContainers: a crash-looping container
// leaves at most two termination message files (the current run's and
// the previous one's), not one per restart.
func TestTerminationFilesGoWithTheirContainers(t *testing.T) {
	t.Parallel()
	f := newFakeRuntime(t)
	rec := newRecorder()
	b := newTestBackend(t, f, rec, backend.Config{}, time.Nanosecond)
	defer b.Close()
	pod := testPod("crash", corev1.RestartPolicyAlways, corev1.Container{
		Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent, TerminationMessagePath: "/dev/termination-log",
	})
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	const restarts = 4
	for i := range restarts {
		rec.wait(t, pod.UID, fmt.Sprintf("running after %d restarts", i), func(p *corev1.Pod) bool {
			cs := p.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].RestartCount == int32(i) && cs[0].State.Running != nil
		})
		f.exit(t, "app", 1)
	}
	rec.wait(t, pod.UID, "running again", func(p *corev1.Pod) bool {
		cs := p.Status.ContainerStatuses
		return len(cs) == 1 && cs[0].RestartCount == restarts && cs[0].State.Running != nil
	})
	files, err := os.ReadDir(filepath.Join(b.cfg.PodDir, string(pod.UID), "containers", "app"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 {
		t.Errorf("%d termination message files after %d restarts, want 2 (the current and the previous run's)", len(files), restarts)
	}
	if cfg := f.running("app"); cfg == nil || !slices.ContainsFunc(cfg.Mounts, func(m *runtimeapi.Mount) bool {
		_, err := os.Stat(m.HostPath)
		return m.ContainerPath == "/dev/termination-log" && err == nil
	}) {
		t.Error("the running container's termination message file is gone")
	}
}
