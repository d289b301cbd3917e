package cri

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
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
	pr.mu.Lock()
	var c *ctr
	for _, x := range pr.ctrs {
		if x.spec.Name == container {
			c = x
		}
	}
	if c == nil {
		pr.mu.Unlock()
		return nil, fmt.Errorf("container %s in pod %s/%s: %w", container, namespace, name, ErrNotFound)
	}
	attempt, id, running := c.restarts, c.id, c.id != "" && !c.exited
	pr.mu.Unlock()
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
		pr.mu.Lock()
		defer pr.mu.Unlock()
		return c.id == id && !c.exited
	}
	rd, wr := io.Pipe()
	go func() {
		defer f.Close()
		wr.CloseWithError(backend.CopyLog(ctx, f, wr, opts, live, b.cfg.PollInterval))
	}()
	return rd, nil
}

// Exec implements backend.Executor through the runtime's ExecSync: the
// command runs in the container and its output is returned when it ends.
// Standard input and a TTY are not supported.
func (b *Backend) Exec(ctx context.Context, namespace, name, container string, cmd []string, eio backend.ExecIO) error {
	pr := b.byName(namespace, name)
	if pr == nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	if len(cmd) == 0 {
		return errors.New("exec: no command given")
	}
	if eio.TTY {
		return errors.New("exec: the cri backend runs commands without a TTY; leave out -t")
	}
	pr.mu.Lock()
	var id string
	for _, c := range pr.ctrs {
		if c.spec.Name == container && !c.exited {
			id = c.id
		}
	}
	pr.mu.Unlock()
	if id == "" {
		return fmt.Errorf("container %s in pod %s/%s is not running", container, namespace, name)
	}
	resp, err := b.rt.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: id, Cmd: cmd})
	if err != nil {
		return fmt.Errorf("exec in container %s: %w", container, err)
	}
	if eio.Stdout != nil {
		_, _ = eio.Stdout.Write(resp.Stdout)
	}
	if eio.Stderr != nil {
		_, _ = eio.Stderr.Write(resp.Stderr)
	}
	if resp.ExitCode != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", resp.ExitCode), Code: int(resp.ExitCode)}
	}
	return nil
}
