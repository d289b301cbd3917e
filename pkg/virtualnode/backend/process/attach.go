package process

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/crilog"
)

// Attach implements backend.Attacher: it follows the container's log from
// its current end and writes each line to the stream it came from (both
// to Stdout with a TTY), until the container stops or ctx ends. The
// container's stdin is not connected: a host process started by the
// backend reads /dev/null, so what an attach session sends is dropped.
func (b *Backend) Attach(ctx context.Context, namespace, name, container string, eio backend.ExecIO) error {
	pr := b.byName(namespace, name)
	if pr == nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	pr.mu.Lock()
	restart := pr.restarts[container]
	p := pr.procs[container]
	pr.mu.Unlock()
	if p == nil || !p.running() {
		return fmt.Errorf("container %s in pod %s/%s is not running: attach needs a running container", container, namespace, name)
	}
	f, err := os.Open(pr.logPath(container, restart))
	if err != nil {
		return fmt.Errorf("container %s in pod %s/%s: %w", container, namespace, name, err)
	}
	defer f.Close()
	// Start at the last complete line: what was printed before the attach
	// is for kubectl logs.
	if _, err := f.Seek(0, io.SeekEnd); err != nil {
		return err
	}
	stdout, stderr := eio.Stdout, eio.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil || eio.TTY {
		stderr = stdout
	}
	if eio.Stdin != nil {
		// Drain stdin so that the client does not block writing it.
		go func() { _, _ = io.Copy(io.Discard, eio.Stdin) }()
	}
	return crilog.Follow(ctx, f, p.running, b.cfg.PollInterval, func(l crilog.LogLine) (bool, error) {
		w := stdout
		if l.Stream == "stderr" {
			w = stderr
		}
		out := l.Msg
		if !l.Partial {
			out = append(out, '\n')
		}
		_, err := w.Write(out)
		return false, err
	})
}

// PortForward implements backend.PortForwarder. A pod's network is the
// host's, so the pod's port is the host's: stream is connected to
// localhost:port, as the kubelet connects to localhost in the pod's
// network namespace, and copied both ways. The client's end of input
// half-closes the connection (the pod's server still answers); the
// forwarding ends when the pod's side closes or ctx ends. The copy from
// the client ends when the caller closes stream.
func (b *Backend) PortForward(ctx context.Context, namespace, name string, port int32, stream io.ReadWriteCloser) error {
	pr := b.byName(namespace, name)
	if pr == nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	if port <= 0 || port > 65535 {
		return fmt.Errorf("port %d: must be 1..65535", port)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort("localhost", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("pod %s/%s port %d: nothing listens on localhost:%d of the node: %w", namespace, name, port, port, err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	go func() {
		_, _ = io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	if _, err := io.Copy(stream, conn); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("pod %s/%s port %d: %w", namespace, name, port, err)
	}
	return nil
}
