package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// id names one run of a container: its process, which a restart
// replaces.
func (p *proc) id() string { return fmt.Sprintf("%d/%d", p.pid, p.startTicks) }

// Exec implements podruntime.Runner: it runs cmd beside run id, as the container's
// user with its environment and working directory, and returns its
// output (stdout, then stderr, the first podruntime.MaxExecOutput bytes)
// and exit code. Past timeout (when not 0) the command's process group is
// killed and the error wraps podruntime.ErrExecTimedOut.
func (pr *podRun) Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	name := pr.containerOf(id)
	if name == "" {
		return nil, 0, fmt.Errorf("%w: process %s is gone", ErrNotFound, id)
	}
	cctx := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		cctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	c, err := pr.command(cctx, name, cmd)
	if err != nil {
		return nil, 0, err
	}
	out := &limitedBuffer{max: podruntime.MaxExecOutput}
	c.Stdout, c.Stderr = out, out
	err = c.Run()
	var ee *exec.ExitError
	switch {
	case timeout > 0 && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded):
		return out.Bytes(), 0, fmt.Errorf("%w: %q timed out after %s", podruntime.ErrExecTimedOut, strings.Join(cmd, " "), timeout)
	case errors.As(err, &ee):
		return out.Bytes(), int32(ee.ExitCode()), nil //nolint:gosec // an exit code
	case err != nil:
		return nil, 0, err
	}
	return out.Bytes(), 0, nil
}

// containerOf is the container whose current process is run id; "" if
// none.
func (pr *podRun) containerOf(id string) string {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for name, p := range pr.procs {
		if p.id() == id && p.running() {
			return name
		}
	}
	return ""
}

// limitedBuffer keeps the first max bytes written to it and drops the
// rest.
type limitedBuffer struct {
	bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); room > 0 {
		b.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
