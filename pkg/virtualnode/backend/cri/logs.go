package cri

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	clientexec "k8s.io/client-go/util/exec"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/crilog"
)

var (
	_ backend.LogReader = (*Backend)(nil)
	_ backend.Executor  = (*Backend)(nil)
)

// Logs implements backend.LogReader over the log files the runtime
// writes, as the kubelet reads them.
func (b *Backend) Logs(ctx context.Context, namespace, name, container string, opts backend.LogOptions) (io.ReadCloser, error) {
	pr := b.byName(namespace, name)
	if pr == nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	c, ok := pr.w.Container(container)
	if !ok {
		return nil, fmt.Errorf("container %s in pod %s/%s: %w", container, namespace, name, ErrNotFound)
	}
	attempt, id, running := c.Restarts, c.ID, c.Running
	if opts.Previous {
		if attempt == 0 || id == "" {
			return nil, fmt.Errorf("previous terminated container %q in pod %q: %w", container, name, ErrNotFound)
		}
		attempt--
		running = false
	}
	f, err := os.Open(filepath.Join(pr.logDir(), container, strconv.Itoa(int(attempt))+".log"))
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	if err != nil {
		return nil, err
	}
	live := func() bool {
		if !running {
			return false
		}
		c, _ := pr.w.Container(container)
		return c.ID == id && c.Running
	}
	rd, wr := io.Pipe()
	go func() {
		defer f.Close()
		wr.CloseWithError(crilog.CopyLog(ctx, f, wr, opts, live, b.cfg.PollInterval))
	}()
	return rd, nil
}

// Exec implements backend.Executor through the runtime's streaming Exec,
// as the kubelet does: the runtime answers with a URL of its streaming
// server, which the backend reaches with SPDY and joins to the caller's
// streams (stdin and a TTY included).
func (b *Backend) Exec(ctx context.Context, namespace, name, container string, cmd []string, eio backend.ExecIO) error {
	pr := b.byName(namespace, name)
	if pr == nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	if len(cmd) == 0 {
		return errors.New("exec: no command given")
	}
	var id string
	if c, ok := pr.w.Container(container); ok && c.Running {
		id = c.ID
	}
	if id == "" {
		return fmt.Errorf("container %s in pod %s/%s is not running", container, namespace, name)
	}
	stderr := eio.Stderr
	if eio.TTY {
		stderr = nil // one stream with a TTY
	}
	resp, err := b.rt.Exec(b.logctx(ctx), &runtimeapi.ExecRequest{
		ContainerId: id, Cmd: cmd, Tty: eio.TTY,
		Stdin: eio.Stdin != nil, Stdout: eio.Stdout != nil, Stderr: stderr != nil,
	})
	if err != nil {
		return fmt.Errorf("exec in container %s: %w", container, err)
	}
	return streamError("exec in container "+container, stream(ctx, resp.Url, eio))
}

// streamError prefixes err with what failed, but for an exit code, which
// is returned as it is: the API's streaming handler finds it by type
// assertion.
func streamError(what string, err error) error {
	if _, ok := err.(utilexec.CodeExitError); ok || err == nil { //nolint:errorlint // see above
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// stream joins eio to a session of the runtime's streaming server at
// rawURL (an exec or attach), over SPDY as the kubelet's
// remotecommand proxy does; the command's exit code comes back as a
// utilexec.CodeExitError.
func stream(ctx context.Context, rawURL string, eio backend.ExecIO) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("the runtime's URL %q: %w", rawURL, err)
	}
	exe, err := remotecommand.NewSPDYExecutor(&rest.Config{}, "POST", u)
	if err != nil {
		return err
	}
	stderr := eio.Stderr
	if eio.TTY {
		stderr = nil
	}
	err = exe.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: eio.Stdin, Stdout: eio.Stdout, Stderr: stderr, Tty: eio.TTY})
	var ce clientexec.CodeExitError
	if errors.As(err, &ce) {
		return utilexec.CodeExitError{Err: err, Code: ce.Code}
	}
	return err
}
