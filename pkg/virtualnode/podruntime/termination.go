package podruntime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/crilog"
)

// The kubelet's termination message limits (kubecontainer).
const (
	// MaxTerminationMessageLength is how much of the termination
	// message file is read: its last 4 KiB.
	MaxTerminationMessageLength   = 4 * 1024
	maxTerminationMessageLogLines = 80
	maxTerminationMessageLogBytes = 2048
)

// TerminationMessage is what the kubelet adds to an exited container's
// message: its termination message file (the last 4 KiB), or with
// FallbackToLogsOnError, when the container failed (exitCode not 0) and
// wrote nothing there, the end of its log at logPath (80 lines, 2048
// bytes).
//
// file is the node's path of the file the runner made for this run of
// the container, "" when it made none; the runner must never name a path
// the pod controls. It is read without following a link, only when it is
// a regular file (a FIFO would block, /dev/zero never end), and at most
// 4 KiB of it.
func TerminationMessage(spec *corev1.Container, exitCode int32, file, logPath string) string {
	fallback := spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && exitCode != 0
	msg, checkLogs := "", fallback
	if file != "" {
		data, err := readTail(file, MaxTerminationMessageLength)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			msg, checkLogs = fmt.Sprintf("Error on reading termination log %s: %v", file, err), false
		default:
			msg, checkLogs = string(data), fallback && len(data) == 0
		}
	}
	if checkLogs {
		msg = lastLogLines(logPath)
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

// WithTerminationMessage appends the container's termination message to
// the runtime's, as the kubelet's toKubeContainerStatus.
func WithTerminationMessage(t *corev1.ContainerStateTerminated, msg string) *corev1.ContainerStateTerminated {
	if msg == "" {
		return t
	}
	if t.Message != "" {
		t.Message += ": "
	}
	t.Message += msg
	return t
}
