package process

import (
	"errors"
	"os/exec"
	"syscall"
)

// startIsolated starts the command newCmd builds in a PID namespace of its
// own when the node may create one (it runs as root): the wrapper is the
// namespace's init, so when it exits — the container's command ended, or
// the pod was deleted — the kernel kills every process left in the
// namespace, including those that left the process group (setsid,
// daemons, background jobs). Without the privilege the container runs in
// a process group only, and the backend says so once.
func (b *Backend) startIsolated(newCmd func() *exec.Cmd, attr *syscall.SysProcAttr) (*exec.Cmd, error) {
	b.isoMu.Lock()
	try := !b.noPIDNamespace
	b.isoMu.Unlock()
	if try {
		cmd := newCmd()
		a := *attr
		a.Cloneflags |= syscall.CLONE_NEWPID
		cmd.SysProcAttr = &a
		err := cmd.Start()
		if err == nil || (!errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EINVAL)) {
			return cmd, err
		}
		b.isoMu.Lock()
		b.noPIDNamespace = true
		b.isoMu.Unlock()
		b.log.Warn("Cannot create a PID namespace per container (run dpkit node as root for it); processes that leave a container's process group (setsid, daemons) will outlive their pod", "err", err)
	}
	cmd := newCmd()
	cmd.SysProcAttr = attr
	return cmd, cmd.Start()
}
