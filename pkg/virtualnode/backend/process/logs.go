package process

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	utilexec "k8s.io/utils/exec"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime/crilog"
)

// ErrNotFound is wrapped by errors about unknown pods and containers.
var ErrNotFound = errors.New("not found")

// Logs implements backend.LogReader over the CRI-format log files.
func (b *Backend) Logs(ctx context.Context, namespace, name, container string, opts backend.LogOptions) (io.ReadCloser, error) {
	pr := b.byName(namespace, name)
	if pr == nil {
		return nil, fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	pr.mu.Lock()
	restart, known := pr.restarts[container]
	p := pr.procs[container]
	pr.mu.Unlock()
	if !known && !hasContainer(pr.pod, container) {
		return nil, fmt.Errorf("container %s in pod %s/%s: %w", container, namespace, name, ErrNotFound)
	}
	if opts.Previous {
		if restart == 0 {
			return nil, fmt.Errorf("previous terminated container %q in pod %q: %w", container, name, ErrNotFound)
		}
		restart--
		p = nil
	}
	f, err := os.Open(pr.logPath(container, restart))
	if errors.Is(err, os.ErrNotExist) {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	if err != nil {
		return nil, err
	}
	live := func() bool { return p != nil && p.running() }
	rd, wr := io.Pipe()
	go func() {
		defer f.Close()
		wr.CloseWithError(crilog.CopyLog(ctx, f, wr, opts, live, b.cfg.PollInterval))
	}()
	return rd, nil
}

func hasContainer(pod *corev1.Pod, name string) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == name {
			return true
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

// Exec implements backend.Executor: it runs cmd as a host process with the
// container's environment and working directory. A TTY is not allocated;
// the streams are plain pipes.
func (b *Backend) Exec(ctx context.Context, namespace, name, container string, cmd []string, eio backend.ExecIO) error {
	pr := b.byName(namespace, name)
	if pr == nil {
		return fmt.Errorf("pod %s/%s: %w", namespace, name, ErrNotFound)
	}
	c, err := pr.command(ctx, container, cmd)
	if err != nil {
		return err
	}
	c.Stdin, c.Stdout, c.Stderr = eio.Stdin, eio.Stdout, eio.Stderr
	if eio.TTY && c.Stderr == nil {
		c.Stderr = eio.Stdout
	}
	err = c.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}

// command is cmd to run beside container's running process: as the
// container's user, with its environment and working directory, in a
// process group of its own that ctx's end kills whole.
func (pr *podRun) command(ctx context.Context, container string, cmd []string) (*exec.Cmd, error) {
	if len(cmd) == 0 {
		return nil, errors.New("exec: no command given")
	}
	pr.mu.Lock()
	p := pr.procs[container]
	pod := pr.pod.DeepCopy()
	pr.mu.Unlock()
	if p == nil || !p.running() {
		return nil, fmt.Errorf("container %s in pod %s/%s is not running", container, pod.Namespace, pod.Name)
	}
	env, dir := p.env, p.dir
	var id identity
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		if c.Name != container {
			continue
		}
		// The command runs as the container's user, like its processes.
		var err error
		if id, err = containerIdentity(pod, &c); err != nil {
			return nil, err
		}
		if env == nil {
			if env, _, err = pr.containerEnv(ctx, pod, c); err != nil {
				return nil, fmt.Errorf("container %s in pod %s/%s: environment: %w", container, pod.Namespace, pod.Name, err)
			}
			dir = pr.workDir(c)
		}
		if id.other && c.WorkingDir == "" {
			dir = "/"
		}
	}
	if dir == "" {
		dir = pr.dir
	}
	c := exec.CommandContext(ctx, cmd[0], cmd[1:]...)
	c.Env, c.Dir = env, dir
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if id.other {
		c.SysProcAttr.Credential = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
	}
	c.Cancel = func() error { return syscall.Kill(-c.Process.Pid, syscall.SIGKILL) }
	// What the command started and left holding its output does not
	// keep the caller waiting past the command's end.
	c.WaitDelay = time.Second
	return c, nil
}
