package cri

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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
	if got := terminationMessage(spec, status(big), dir); len(got) != maxTerminationMessageLength || !strings.HasSuffix(got, "END") {
		t.Errorf("a 10 KB file gave %d bytes ending %q, want its last %d", len(got), got[max(0, len(got)-3):], maxTerminationMessageLength)
	}
}
