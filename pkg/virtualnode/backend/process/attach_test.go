package process

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// lineWriter records what is written and closes seen once it holds want.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func newLineWriter(want string) *lineWriter {
	return &lineWriter{want: want, seen: make(chan struct{})}
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestAttach checks attach gives what the container prints from the
// attach on, stdout and stderr apart, and ends when the container exits.
func TestAttach(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	dir := t.TempDir()
	b := newBackend(t, dir, rec)
	defer b.Close()
	stop := filepath.Join(dir, "stop")
	pod := testPod("attach", corev1.RestartPolicyNever, nil,
		sh("app", `echo before; echo before-err >&2; while [ ! -f `+stop+` ]; do echo out; echo err >&2; sleep 0.05; done; echo bye`))
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, pod.UID, "running", phase(corev1.PodRunning))
	// "before" is in the log before the attach starts.
	logs := newLineWriter("before-err\n")
	go func() {
		rc, err := b.Logs(context.Background(), "ns", "attach", "app", backend.LogOptions{Tail: -1, Follow: true})
		if err == nil {
			_, _ = io.Copy(logs, rc)
			rc.Close()
		}
	}()
	<-logs.seen

	stdout, stderr := newLineWriter("out\n"), newLineWriter("err\n")
	done := make(chan error, 1)
	go func() {
		done <- b.Attach(context.Background(), "ns", "attach", "app", backend.ExecIO{Stdout: stdout, Stderr: stderr, Stdin: strings.NewReader("ignored")})
	}()
	<-stdout.seen
	<-stderr.seen
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Attach: %v", err)
	}
	out, errOut := stdout.String(), stderr.String()
	if strings.Contains(out, "before") || strings.Contains(errOut, "before") {
		t.Errorf("attach gave output printed before it: stdout %q stderr %q", out, errOut)
	}
	if strings.Contains(out, "err") || strings.Contains(errOut, "out") || strings.Contains(errOut, "bye") {
		t.Errorf("streams mixed: stdout %q stderr %q", out, errOut)
	}
	if !strings.HasSuffix(out, "bye\n") {
		t.Errorf("stdout %q, want it to end with the container's last line", out)
	}
	// A container that is not running cannot be attached to.
	if err := b.Attach(context.Background(), "ns", "attach", "app", backend.ExecIO{Stdout: io.Discard}); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("Attach to an exited container: %v, want not running", err)
	}
	if err := b.Attach(context.Background(), "ns", "nope", "app", backend.ExecIO{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Attach to an unknown pod: %v, want ErrNotFound", err)
	}
}

// halfStream is a port-forward stream: the client's bytes, then end of
// input; what comes back is recorded.
type halfStream struct {
	in  io.Reader
	mu  sync.Mutex
	out bytes.Buffer
}

func (*halfStream) Close() error { return nil }

func (s *halfStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.Write(p)
}

func (s *halfStream) Read(p []byte) (int, error) { return s.in.Read(p) }

func (s *halfStream) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// TestPortForward checks a pod's port is the host's: the stream reaches a
// server on localhost, the end of the client's input half-closes the
// connection and the server's answer still comes back.
func TestPortForward(t *testing.T) {
	t.Parallel()
	rec := newRecorder()
	b := newBackend(t, t.TempDir(), rec)
	defer b.Close()
	pod := testPod("pf", corev1.RestartPolicyNever, nil, sh("app", "exec sleep 600"))
	// A SIGTERM that comes before the container's command runs is lost,
	// as with a runtime's container init; SIGKILL ends it a second later.
	pod.Spec.TerminationGracePeriodSeconds = new(int64(1))
	if err := b.CreatePod(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	defer func() {
		// Ended before the backend closes and the directory goes: the
		// pod's last state is written once its process has exited.
		_ = b.DeletePod(context.Background(), pod)
		rec.wait(t, pod.UID, "ended", func(p *corev1.Pod) bool {
			return p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
		})
	}()
	rec.wait(t, pod.UID, "running", phase(corev1.PodRunning))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, _ := io.ReadAll(c) // until the client's half-close
		_, _ = c.Write(append([]byte("pong:"), req...))
	}()
	port := int32(l.Addr().(*net.TCPAddr).Port)
	s := &halfStream{in: strings.NewReader("ping")}
	if err := b.PortForward(context.Background(), "ns", "pf", port, s); err != nil {
		t.Fatalf("PortForward: %v", err)
	}
	<-served
	if got := s.String(); got != "pong:ping" {
		t.Errorf("answer %q, want pong:ping", got)
	}
	l.Close()
	// Not the port just closed: another process may listen there by now.
	if err := b.PortForward(context.Background(), "ns", "pf", boundPort(t), &halfStream{in: strings.NewReader("")}); err == nil || !strings.Contains(err.Error(), "nothing listens") {
		t.Errorf("PortForward to a closed port: %v, want nothing listens", err)
	}
	if err := b.PortForward(context.Background(), "ns", "nope", port, &halfStream{in: strings.NewReader("")}); !errors.Is(err, ErrNotFound) {
		t.Errorf("PortForward to an unknown pod: %v, want ErrNotFound", err)
	}
}

// boundPort returns a port of 127.0.0.1 held, until t ends, by a socket
// bound to it that does not listen: a connection to it is refused, and no
// other process can listen there meanwhile.
func boundPort(t *testing.T) int32 {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return int32(sa.(*syscall.SockaddrInet4).Port)
}
