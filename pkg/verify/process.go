package verify

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

// Environment variables set for the plugin command.
const (
	// EnvPluginDir names the emulated kubelet's device plugin directory.
	// The dpkit SDK serves there when its Config sets no PluginDir.
	EnvPluginDir = deviceplugin.EnvPluginDir
	// EnvRegistryDir names the emulated plugins_registry directory
	// (plugin-watcher mode only). The dpkit SDK uses it when its Config
	// sets no RegistryDir.
	EnvRegistryDir = deviceplugin.EnvRegistryDir
	// EnvSampleSockDir is read by the upstream sample device plugin.
	EnvSampleSockDir = "PLUGIN_SOCK_DIR"
)

// Placeholders replaced in the command's arguments.
const (
	PlaceholderPluginDir   = "{plugin-dir}"
	PlaceholderRegistryDir = "{registry-dir}"
)

// ErrNotRoot is returned when PrivateMount is asked for without root.
var ErrNotRoot = errors.New("--private-mount needs root: it creates a mount namespace and bind-mounts the emulated directory over " + pluginapi.DevicePluginPath + "; run as root, or give the plugin the directory with {plugin-dir} or $" + EnvPluginDir)

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

// process is the plugin under test.
type process struct {
	cmd    *exec.Cmd
	out    *outputTail
	done   chan struct{}
	err    error // set before done closes
	exited time.Time
}

// expandArgs replaces the placeholders in args.
func expandArgs(args []string, pluginDir, registryDir string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		a = strings.ReplaceAll(a, PlaceholderPluginDir, pluginDir)
		if registryDir != "" {
			a = strings.ReplaceAll(a, PlaceholderRegistryDir, registryDir)
		}
		out[i] = a
	}
	return out
}

// startProcess starts the plugin command. With privateMount the command
// runs in its own mount namespace where pluginapi.DevicePluginPath is a
// bind mount of pluginDir.
func startProcess(command []string, env []string, pluginDir string, privateMount bool) (*process, error) {
	if len(command) == 0 {
		return nil, errors.New("no plugin command given; put it after --, e.g. dpkit verify -- my-plugin --flag")
	}
	cmd := exec.Command(command[0], command[1:]...)
	cmd.Env = env
	out := &outputTail{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so that the whole plugin can be signalled.
	// On Linux the kernel kills it when verify dies, even of SIGKILL
	// (parentDeathSignal).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	parentDeathSignal(cmd.SysProcAttr)
	p := &process{cmd: cmd, out: out, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal comes when the thread that started
		// the process ends, not verify (prctl(2) PR_SET_PDEATHSIG;
		// golang/go#27505): the thread is this goroutine's until the
		// process has exited. With privateMount it never is anyone
		// else's: its mount namespace is the plugin's, and it ends
		// with this goroutine.
		runtime.LockOSThread()
		var err error
		if privateMount {
			err = startInPrivateMount(cmd, pluginDir, pluginapi.DevicePluginPath)
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

// signal sends sig to the plugin's process group.
func (p *process) signal(sig syscall.Signal) error {
	return syscall.Kill(-p.cmd.Process.Pid, sig)
}

// running reports whether the process has not exited.
func (p *process) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// waitExit waits up to d for the process to exit.
func (p *process) waitExit(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
}

// kill ends the process group and waits for it.
func (p *process) kill() {
	if p.running() {
		_ = p.signal(syscall.SIGKILL)
	}
	<-p.done
}
