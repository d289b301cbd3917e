// Package verifyproc runs the command that dpkit's checkers verify (a
// device plugin for pkg/verify, a DRA driver for pkg/verify/draverify):
// in its own process group, killed with the checker, the end of its
// output kept, and told where the emulated kubelet serves through the
// environment variables and argument placeholders below. Both checkers
// use it; neither exports it, since a user of the library configures the
// command, not how it is started.
package verifyproc

import (
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// Environment variables set for the command under verification.
const (
	// EnvPluginDir names the emulated kubelet's device plugin directory.
	// The dpkit SDK serves there when its Config sets no PluginDir.
	EnvPluginDir = deviceplugin.EnvPluginDir
	// EnvRegistryDir names the emulated plugins_registry directory (a
	// device plugin in plugin-watcher mode, every DRA driver). The dpkit
	// SDK uses it when its Config sets no RegistryDir.
	EnvRegistryDir = deviceplugin.EnvRegistryDir
	// EnvSampleSockDir is read by the upstream sample device plugin.
	EnvSampleSockDir = "PLUGIN_SOCK_DIR"
	// EnvDRAPluginsDir names the kubelet's plugins directory, where a DRA
	// driver serves <dir>/<driver>/dra.sock.
	EnvDRAPluginsDir = "DPKIT_DRA_PLUGINS_DIR"
	// EnvCDIDir names the CDI spec directory.
	EnvCDIDir = "DPKIT_CDI_DIR"
	// EnvNodeName names the node a DRA driver publishes for.
	EnvNodeName = "NODE_NAME"
	// EnvKubeconfig names a DRA driver's API server client configuration.
	EnvKubeconfig = "KUBECONFIG"
	// EnvPodUID names the UID of the pod a DRA driver runs in (the
	// downward API's metadata.uid): each instance of a rolling update
	// has its own.
	EnvPodUID = "POD_UID"
)

// Placeholders replaced in the command's arguments.
const (
	PlaceholderPluginDir   = "{plugin-dir}"
	PlaceholderRegistryDir = "{registry-dir}"
	PlaceholderPluginsDir  = "{plugins-dir}"
	PlaceholderCDIDir      = "{cdi-dir}"
	PlaceholderNodeName    = "{node-name}"
	PlaceholderKubeconfig  = "{kubeconfig}"
	PlaceholderPodUID      = "{pod-uid}"
)

// ErrNotRoot is returned when a private mount namespace is asked for
// without root.
var ErrNotRoot = errors.New("needs root: it creates a mount namespace and bind-mounts the emulated directory over " + pluginapi.DevicePluginPath + "; run as root, or give the plugin the directory with " + PlaceholderPluginDir + " or $" + EnvPluginDir)

// ExpandArgs replaces the placeholders (keys of vals) in args.
func ExpandArgs(args []string, vals map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range vals {
			a = strings.ReplaceAll(a, k, v)
		}
		out[i] = a
	}
	return out
}

// outputTail keeps the last bytes a process wrote.
type outputTail struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (o *outputTail) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf.Write(p)
	if extra := o.buf.Len() - o.max; extra > 0 {
		o.buf.Next(extra)
	}
	return len(p), nil
}

func (o *outputTail) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Process is a command run under verify: in its own process group, with
// the end of its output kept.
type Process struct {
	cmd    *exec.Cmd
	out    *outputTail
	done   chan struct{}
	err    error // set before done closes
	exited time.Time
}

// Start starts command with env.
func Start(command, env []string) (*Process, error) { return start(command, env, "", "") }

// StartInMount starts command with env in its own mount namespace where
// dst is a bind mount of src, for a plugin that only knows dst. It needs
// root (ErrNotRoot) and Linux.
func StartInMount(command, env []string, src, dst string) (*Process, error) {
	return start(command, env, src, dst)
}

func start(command, env []string, src, dst string) (*Process, error) {
	if len(command) == 0 {
		return nil, errors.New("no command given")
	}
	privateMount := dst != ""
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = env
	out := &outputTail{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so that the whole command can be signalled.
	// On Linux the kernel kills it when verify dies, even of SIGKILL
	// (parentDeathSignal).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	parentDeathSignal(cmd.SysProcAttr)
	p := &Process{cmd: cmd, out: out, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal comes when the thread that started
		// the process ends, not verify (prctl(2) PR_SET_PDEATHSIG;
		// golang/go#27505): the thread is this goroutine's until the
		// process has exited. With a private mount it never is anyone
		// else's: its mount namespace is the command's, and it ends
		// with this goroutine.
		runtime.LockOSThread()
		var err error
		if privateMount {
			err = startInPrivateMount(cmd, src, dst)
		} else {
			err = cmd.Start()
		}
		started <- err
		if err == nil {
			<-p.done
		}
		if !privateMount {
			runtime.UnlockOSThread()
		}
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", command[0], err)
	}
	go func() {
		p.err = cmd.Wait()
		p.exited = time.Now()
		close(p.done)
	}()
	return p, nil
}

// PID is the process's ID, also its process group's.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// WaitExit waits up to d for the process to exit.
func (p *Process) WaitExit(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
}

// Kill kills the process group and waits for the process.
func (p *Process) Kill() {
	if p.Running() {
		_ = p.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// Output is the end of what the process wrote.
func (p *Process) Output() string { return p.out.String() }

// Exit says how the process ended ("exited with status 2"); "" while it
// runs.
func (p *Process) Exit() string {
	select {
	case <-p.done:
		return ExitDescription(p.err)
	default:
		return ""
	}
}

// Exited is when the process exited; the zero time while it runs.
func (p *Process) Exited() time.Time {
	select {
	case <-p.done:
		return p.exited
	default:
		return time.Time{}
	}
}

// ListeningSockets returns the paths of the unix sockets that the
// processes of the process group listen on; ok is false where that
// cannot be known (not Linux, /proc unreadable).
func (p *Process) ListeningSockets() (paths []string, ok bool) {
	return listeningSockets(p.cmd.Process.Pid)
}

// ExitDescription says how a process ended, from the error of its Wait:
// "exited with status 0", "exited with status 2", "was killed by signal
// 9 (killed)".
func ExitDescription(err error) string {
	if err == nil {
		return "exited with status 0"
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return "ended: " + err.Error()
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return fmt.Sprintf("was killed by signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	return fmt.Sprintf("exited with status %d", ee.ExitCode())
}
