package process

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dpkit/dpkit/internal/procfs"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

// wrapper runs the container's command in the foreground and writes its
// exit code to fd 3, an exit file the node opened for it, so that the code
// survives a restart of the node (and needs no write access to the pod's
// directory when the container runs as another user). The command itself
// does not inherit fd 3. The trap (a handler, not "ignore", so the command
// keeps default signal dispositions) lets the shell outlive a SIGTERM sent
// to the process group long enough to write the code.
const wrapper = `trap : TERM INT; "$@" 3>&-; rc=$?; echo $rc >&3; exit $rc`

// configError is a container whose configuration the backend refuses
// (the kubelet's CreateContainerConfigError): it is not started.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// proc is one run of a container.
type proc struct {
	pid        int
	startTicks uint64
	started    metav1.Time
	env        []string
	dir        string

	exited   chan struct{}
	code     int32
	reason   string
	finished metav1.Time
}

func (p *proc) signal(sig syscall.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	// The wrapper leads its own process group: signal the whole group.
	_ = syscall.Kill(-p.pid, sig)
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (pr *podRun) exitFile(container string, restart int32) string {
	return filepath.Join(pr.dir, fmt.Sprintf("%s.%d.exit", container, restart))
}

func (pr *podRun) logPath(container string, restart int32) string {
	return filepath.Join(pr.dir, "logs", container, fmt.Sprintf("%d.log", restart))
}

func (pr *podRun) fifo(container, stream string) string {
	return filepath.Join(pr.dir, container+"."+stream)
}

// containerEnv builds the process environment: the literal values of the
// container's env, then what Config.ContainerEnv gives (the values the node
// resolved, the device plugins'), then what its CDI devices' specs give,
// then HOSTNAME and a PATH when none is set.
func (pr *podRun) containerEnv(ctx context.Context, pod *corev1.Pod, c corev1.Container) ([]string, map[string]string, error) {
	var vars podruntime.Env
	vars.Set("HOSTNAME", pod.Name)
	if err := vars.AddContainerEnv(ctx, pod, &c, pr.b.cfg.ContainerEnv, nil); err != nil {
		return nil, nil, err
	}
	cdiEnv, err := pr.cdiEnv(ctx, pod, c.Name)
	if err != nil {
		return nil, nil, err
	}
	for _, kv := range cdiEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars.Set(k, v)
		}
	}
	if !vars.Has("PATH") {
		vars.Set("PATH", envOr("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"))
	}
	env := make([]string, 0, len(vars.Names()))
	for _, k := range vars.Names() {
		env = append(env, k+"="+vars.Get(k))
	}
	return env, vars.Vars(), nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func (pr *podRun) workDir(c corev1.Container) string {
	if c.WorkingDir != "" {
		return c.WorkingDir
	}
	return pr.dir
}

// startProc starts one run of c with env; vars expand $(VAR) in its
// command and args.
func (pr *podRun) startProc(pod *corev1.Pod, c corev1.Container, restart int32, env []string, vars map[string]string) (*proc, error) {
	id, err := containerIdentity(pod, &c)
	if err != nil {
		return nil, &configError{err}
	}
	argv := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range c.Command {
		argv = append(argv, podruntime.Expand(a, vars))
	}
	for _, a := range c.Args {
		argv = append(argv, podruntime.Expand(a, vars))
	}
	logPath := pr.logPath(c.Name, restart)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o750); err != nil {
		return nil, err
	}
	exitFile := pr.exitFile(c.Name, restart)
	_ = os.Remove(exitFile)
	exitW, err := os.OpenFile(exitFile, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating exit file: %w", err)
	}

	// Each stream goes through a named pipe: the process holds it open
	// read-write, so writes never fail while the node is down (they
	// block once the pipe is full), and the node reads it into the log.
	var childFiles []*os.File
	var readers []*os.File
	closeAll := func() {
		for _, f := range childFiles {
			_ = f.Close()
		}
		_ = exitW.Close()
	}
	for _, stream := range []string{"stdout", "stderr"} {
		path := pr.fifo(c.Name, stream)
		_ = os.Remove(path)
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			closeAll()
			return nil, fmt.Errorf("creating %s pipe: %w", stream, err)
		}
		w, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("opening %s pipe: %w", stream, err)
		}
		childFiles = append(childFiles, w)
	}
	dir := pr.workDir(c)
	if id.other && c.WorkingDir == "" {
		// The pod's directory is the node's; another user starts in /,
		// as a container whose image sets no working directory.
		dir = "/"
	}
	newCmd := func() *exec.Cmd {
		cmd := exec.Command(pr.b.cfg.Shell, append([]string{"-c", wrapper, c.Name}, argv...)...)
		cmd.Env = env
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = childFiles[0], childFiles[1]
		cmd.ExtraFiles = []*os.File{exitW}
		return cmd
	}
	attr := &syscall.SysProcAttr{Setpgid: true}
	if id.other {
		attr.Credential = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
	}
	cmd, err := pr.b.startIsolated(newCmd, attr)
	if err != nil {
		closeAll()
		return nil, err
	}
	for _, stream := range []string{"stdout", "stderr"} {
		r, err := os.OpenFile(pr.fifo(c.Name, stream), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			pr.b.log.Error("Opening container output", "container", c.Name, "err", err)
			continue
		}
		readers = append(readers, r)
	}
	closeAll()
	p := &proc{
		pid:     cmd.Process.Pid,
		started: metav1.NewTime(time.Now()),
		env:     env,
		dir:     cmd.Dir,
		exited:  make(chan struct{}),
	}
	p.startTicks, _ = procStartTicks(p.pid)
	logsDone := pr.pumpLogs(logPath, readers)
	go func() {
		err := cmd.Wait()
		p.code = exitCode(cmd.ProcessState, err)
		<-logsDone
		p.finished = metav1.NewTime(time.Now())
		close(p.exited)
	}()
	// The spec's command and args, not argv: $(VAR) may expand to a
	// Secret's value.
	pr.b.log.Info("Container started", "pod", pod.Namespace+"/"+pod.Name, "container", c.Name, "pid", p.pid, "command", c.Command, "args", c.Args)
	return p, nil
}

// adoptProc follows a process started by a previous run, or returns nil
// when it is gone.
func (pr *podRun) adoptProc(container string, ps procState, started metav1.Time) *proc {
	ticks, err := procStartTicks(ps.PID)
	if err != nil || ticks != ps.StartTicks {
		return nil
	}
	p := &proc{pid: ps.PID, startTicks: ticks, started: started, exited: make(chan struct{})}
	p.env, p.dir = procEnv(ps.PID), ""
	var readers []*os.File
	for _, stream := range []string{"stdout", "stderr"} {
		r, err := os.OpenFile(pr.fifo(container, stream), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err == nil {
			readers = append(readers, r)
		}
	}
	logsDone := pr.pumpLogs(pr.logPath(container, ps.RestartCount), readers)
	exitFile := pr.exitFile(container, ps.RestartCount)
	go func() {
		t := time.NewTicker(pr.b.cfg.PollInterval)
		defer t.Stop()
		for range t.C {
			if ticks, err := procStartTicks(ps.PID); err != nil || ticks != ps.StartTicks {
				break
			}
		}
		<-logsDone
		p.code, p.reason = readExit(exitFile)
		if p.reason == podruntime.ReasonCompleted || p.reason == podruntime.ReasonError {
			p.reason = ""
		}
		p.finished = metav1.NewTime(time.Now())
		close(p.exited)
	}()
	pr.b.log.Info("Following container of a previous run", "container", container, "pid", ps.PID)
	return p
}

// readExit reads an exit file written by the wrapper. A missing file
// means the wrapper itself was killed (SIGKILL at the end of the grace
// period) or the process vanished while nobody watched.
func readExit(path string) (int32, string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 137, podruntime.ReasonContainerStatusUnknown
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 137, podruntime.ReasonContainerStatusUnknown
	}
	return int32(n), podruntime.ExitReason(int32(n))
}

func exitCode(ps *os.ProcessState, err error) int32 {
	if ps == nil {
		if err != nil {
			return 128
		}
		return 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	return int32(ps.ExitCode())
}

// pumpLogs copies the streams into the log file, one CRI-format line
// ("<RFC3339Nano> <stream> F <text>") per line read. The channel is
// closed when every stream reached EOF (no writer left).
func (pr *podRun) pumpLogs(path string, readers []*os.File) <-chan struct{} {
	done := make(chan struct{})
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		pr.b.log.Error("Opening container log", "path", path, "err", err)
		for _, r := range readers {
			_ = r.Close()
		}
		close(done)
		return done
	}
	var mu sync.Mutex // guards f and size
	var size int64
	if fi, err := f.Stat(); err == nil {
		size = fi.Size()
	}
	var wg sync.WaitGroup
	for i, r := range readers {
		stream := "stdout"
		if i == 1 {
			stream = "stderr"
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			br := bufio.NewReaderSize(r, 16<<10)
			for {
				line, err := br.ReadSlice('\n')
				if len(line) > 0 {
					tag := "F"
					if line[len(line)-1] == '\n' {
						line = line[:len(line)-1]
					} else if errors.Is(err, bufio.ErrBufferFull) {
						tag = "P"
					}
					mu.Lock()
					n, _ := fmt.Fprintf(f, "%s %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, tag, line)
					if size += int64(n); size >= pr.b.cfg.ContainerLogMaxSize {
						if nf, err := pr.rotateLog(path, f); err != nil {
							pr.b.log.Error("Rotating container log", "path", path, "err", err)
						} else {
							f, size = nf, 0
						}
					}
					mu.Unlock()
				}
				if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
					if !errors.Is(err, io.EOF) {
						pr.b.log.Debug("Container output", "path", path, "err", err)
					}
					return
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		mu.Lock()
		_ = f.Close()
		mu.Unlock()
		close(done)
	}()
	return done
}

// rotateLog closes the log file f at path, renames it to
// path.<UTC timestamp> and opens a new one, keeping at most
// ContainerLogMaxFiles files (the new one included): the oldest rotated
// ones are removed. Like the kubelet, "kubectl logs" reads the current
// file only.
func (pr *podRun) rotateLog(path string, f *os.File) (*os.File, error) {
	if err := f.Close(); err != nil {
		return nil, err
	}
	rotated := path + "." + time.Now().UTC().Format("20060102-150405.000000000")
	if err := os.Rename(path, rotated); err != nil {
		return nil, err
	}
	old, _ := filepath.Glob(path + ".*")
	sort.Strings(old) // timestamps sort by time
	for len(old) > pr.b.cfg.ContainerLogMaxFiles-1 {
		_ = os.Remove(old[0])
		old = old[1:]
	}
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
}

// procStartTicks reads the start time of a process (in clock ticks since
// boot), which tells a process from a later one that reuses its PID. An
// exited process (a zombie) is an error.
func procStartTicks(pid int) (uint64, error) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0, err
	}
	if st.Exited() {
		return 0, fmt.Errorf("process %d exited", pid)
	}
	return st.StartTicks(), nil
}

func procEnv(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return nil
	}
	var env []string
	for _, kv := range strings.Split(string(data), "\x00") {
		if kv != "" {
			env = append(env, kv)
		}
	}
	return env
}

var _ backend.Backend = (*Backend)(nil)
