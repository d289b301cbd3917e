package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is one binary the control plane started. Its output goes to a log
// file in the control plane's directory.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	waitErr error
}

func startProcess(name, path, logPath string, args []string) (*process, error) {
	return startSpec(procSpec{name: name, path: path, logPath: logPath, args: args})
}

// procSpec describes a process to start: startProcess's arguments, plus
// what the test node's processes need.
type procSpec struct {
	name, path, logPath string
	args                []string
	// env is appended to the test's environment (a later entry wins).
	env []string
	// extraFiles become the child's file descriptors 3, 4, ...
	extraFiles []*os.File
	// appendLog keeps an existing log (a restarted component).
	appendLog bool
	// sys replaces sysProcAttr().
	sys *syscall.SysProcAttr
}

func startSpec(s procSpec) (*process, error) {
	flags := os.O_CREATE | os.O_WRONLY | os.O_TRUNC
	if s.appendLog {
		flags = os.O_CREATE | os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(s.logPath, flags, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", s.name, err)
	}
	cmd := exec.Command(s.path, s.args...)
	cmd.Stdout = f
	cmd.Stderr = f
	cmd.Env = append(os.Environ(), s.env...)
	cmd.ExtraFiles = s.extraFiles
	cmd.SysProcAttr = sysProcAttr()
	if s.sys != nil {
		cmd.SysProcAttr = s.sys
	}
	fmt.Fprintf(f, "# %s %s\n", s.path, strings.Join(s.args, " "))
	p := &process{name: s.name, cmd: cmd, logPath: s.logPath, logFile: f, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The kernel sends the parent-death signal when the thread that
		// started the process ends, not the test binary (prctl(2)
		// PR_SET_PDEATHSIG; golang/go#27505), and a goroutine that
		// returns locked to its thread ends that thread (dpkit verify's
		// private mount does, in the same test binary). This goroutine
		// keeps the thread that starts the process until the process
		// has exited, so no other goroutine can end it.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			f.Close()
			started <- err
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", s.name, s.path, err)
	}
	return p, nil
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// stop ends the process by its PID: SIGTERM, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) error {
	return p.stopWith(syscall.SIGTERM, grace)
}

// stopWith sends sig, then SIGKILL after grace, and waits for the exit.
func (p *process) stopWith(sig syscall.Signal, grace time.Duration) error {
	if done, _ := p.exited(); done {
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s (pid %d): %v: %w", p.name, p.pid(), sig, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s (pid %d): SIGKILL: %w", p.name, p.pid(), err)
	}
	<-p.done
	return nil
}

// tail returns the last lines of the process's log.
func (p *process) tail(lines int) string {
	return tailFile(p.logPath, lines)
}

func tailFile(path string, lines int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	const max = 16 << 10
	if st, err := f.Stat(); err == nil && st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return fmt.Sprintf("(read log: %v)", err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(read log: %v)", err)
	}
	all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n")))
}

// failure describes why a process is not usable, with its log tail.
func (p *process) failure(what error) error {
	return fmt.Errorf("%s (pid %d, log %s): %w\n--- last lines of %s ---\n%s", p.name, p.pid(), p.logPath, what, p.logPath, p.tail(30))
}
