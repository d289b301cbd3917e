package cri

import (
	"context"
	"errors"
	"time"

	remote "k8s.io/cri-client/pkg"
	utilexec "k8s.io/utils/exec"

	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// Probes and hooks are podruntime's worker's; they exec in a container
// through the runtime's ExecSync.

// runtimeRequestTimeout is the kubelet's default --runtime-request-timeout,
// which bounds each call to the runtime, an exec beyond its own timeout.
const runtimeRequestTimeout = 2 * time.Minute

// execSync runs cmd in the container through the runtime's ExecSync and
// returns its output (stdout, then stderr) and exit code. timeout 0 runs
// it until ctx ends; else the call is bounded by timeout and the
// RequestTimeout beyond it, and an exec past it is an error wrapping
// remote.ErrCommandTimedOut and podruntime.ErrExecTimedOut, as the
// kubelet's.
func (pr *podRun) Exec(ctx context.Context, id string, cmd []string, timeout time.Duration) ([]byte, int32, error) {
	stdout, stderr, err := pr.b.rt.ExecSync(pr.b.logctx(ctx), id, cmd, timeout)
	var exit utilexec.CodeExitError
	switch {
	case errors.As(err, &exit):
		return append(stdout, stderr...), int32(exit.Code), nil //nolint:gosec // the runtime's int32
	case errors.Is(err, remote.ErrCommandTimedOut):
		return nil, 0, execTimeout{err}
	case err != nil:
		return nil, 0, err
	}
	return append(stdout, stderr...), 0, nil
}

// execTimeout is the runtime's timeout error, also podruntime's.
type execTimeout struct{ error }

func (e execTimeout) Unwrap() []error { return []error{e.error, podruntime.ErrExecTimedOut} }
