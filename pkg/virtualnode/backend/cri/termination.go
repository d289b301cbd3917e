package cri

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/crilog"
)

// The kubelet's termination message limits (kubecontainer).
const (
	maxTerminationMessageLength   = 4 * 1024
	maxTerminationMessageLogLines = 80
	maxTerminationMessageLogBytes = 2048
)

// etcHostsMount is the pod's managed /etc/hosts, as the kubelet mounts
// it: when the pod has an address (the node's with hostNetwork) and the
// container mounts nothing of its own there.
func (pr *podRun) etcHostsMount(spec *corev1.Container) (*runtimeapi.Mount, error) {
	pr.mu.Lock()
	ip := pr.podIP
	pr.mu.Unlock()
	if pr.pod.Spec.HostNetwork {
		ip = pr.b.cfg.NodeIP
	}
	if ip == "" {
		return nil, nil
	}
	for _, m := range spec.VolumeMounts {
		if m.MountPath == "/etc/hosts" {
			return nil, nil
		}
	}
	path, err := pr.ensureEtcHosts(ip)
	if err != nil {
		return nil, fmt.Errorf("writing the pod's /etc/hosts: %w", err)
	}
	return &runtimeapi.Mount{ContainerPath: "/etc/hosts", HostPath: path}, nil
}

// containerDir is where a container's termination message files are.
func (pr *podRun) containerDir(name string) string {
	return filepath.Join(pr.podDir(), "containers", name)
}

// terminationMessageMount is the file the container may write its
// termination message to, as the kubelet's: a new world-writable file
// <pod dir>/containers/<name>/<random> per run, at
// terminationMessagePath.
func (pr *podRun) terminationMessageMount(spec *corev1.Container) (*runtimeapi.Mount, error) {
	if spec.TerminationMessagePath == "" {
		return nil, nil
	}
	dir := pr.containerDir(spec.Name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	path := filepath.Join(dir, fmt.Sprintf("%08x", binary.BigEndian.Uint32(b[:])))
	f, err := os.Create(path) //nolint:gosec // under the pod's directory
	if err != nil {
		return nil, fmt.Errorf("creating the termination message file: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o666); err != nil { //nolint:gosec // any user of the container writes it, as under the kubelet
		return nil, err
	}
	return &runtimeapi.Mount{ContainerPath: spec.TerminationMessagePath, HostPath: path}, nil
}

// removeTerminationFiles removes the termination message files among
// mounts: those the backend made under the pod's containers directory.
func (pr *podRun) removeTerminationFiles(mounts []*runtimeapi.Mount) {
	base := filepath.Join(pr.podDir(), "containers")
	for _, m := range mounts {
		if filepath.Dir(filepath.Dir(m.HostPath)) != base {
			continue
		}
		if err := os.Remove(m.HostPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
			pr.b.log.Warn("Removing a termination message file", "pod", pr.key(), "path", m.HostPath, "err", err)
		}
	}
}

// terminationMessage is what the kubelet adds to an exited container's
// message: the file at terminationMessagePath (its last 4 KiB), or with
// FallbackToLogsOnError, when the container failed and wrote nothing
// there, the end of its log (80 lines, 2048 bytes).
//
// The file read is the one the backend made for the run, in dir (the
// container's directory under the pod's): a volume the pod mounts at the
// same path is never read, so a link the pod planted there cannot put a
// node file into the status. It is read without following a link, only
// when it is a regular file (a FIFO would block, /dev/zero never end), and
// at most 4 KiB of it.
func terminationMessage(spec *corev1.Container, s *runtimeapi.ContainerStatus, dir string) string {
	fallback := spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && s.ExitCode != 0
	msg, checkLogs := "", fallback
	if spec.TerminationMessagePath != "" {
		for _, m := range s.Mounts {
			if m.ContainerPath != spec.TerminationMessagePath || filepath.Dir(m.HostPath) != dir {
				continue
			}
			data, err := readTail(m.HostPath, maxTerminationMessageLength)
			switch {
			case errors.Is(err, fs.ErrNotExist):
			case err != nil:
				msg, checkLogs = fmt.Sprintf("Error on reading termination log %s: %v", m.HostPath, err), false
			default:
				msg, checkLogs = string(data), fallback && len(data) == 0
			}
			break
		}
	}
	if checkLogs {
		msg = lastLogLines(s.LogPath)
	}
	return msg
}

// readTail reads at most the last n bytes of a regular file, without
// following a link at path and without blocking on a FIFO.
func readTail(path string, n int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%s is a symbolic link", path)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, st.Mode().Type())
	}
	if st.Size() > n {
		if _, err := f.Seek(-n, io.SeekEnd); err != nil {
			return nil, err
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// lastLogLines is the kubelet's readLastStringFromContainerLogs: the
// text of the log's last 80 lines, at most 2048 bytes of it.
func lastLogLines(path string) string {
	data, err := readTail(path, 1<<20)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n"))
	if len(lines) > maxTerminationMessageLogLines {
		lines = lines[len(lines)-maxTerminationMessageLogLines:]
	}
	var out bytes.Buffer
	for _, l := range lines {
		parsed, ok := crilog.ParseLogLine(l)
		if !ok {
			continue
		}
		out.Write(parsed.Msg)
		if !parsed.Partial {
			out.WriteByte('\n')
		}
	}
	b := out.Bytes()
	if len(b) > maxTerminationMessageLogBytes {
		b = b[:maxTerminationMessageLogBytes]
	}
	return string(b)
}

// withTerminationMessage appends the container's termination message to
// the runtime's, as the kubelet's toKubeContainerStatus.
func withTerminationMessage(t *corev1.ContainerStateTerminated, msg string) *corev1.ContainerStateTerminated {
	if msg == "" {
		return t
	}
	if t.Message != "" {
		t.Message += ": "
	}
	t.Message += msg
	return t
}
