package differential

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dpkit/dpkit/test/upstream"
)

// event is one line a device manager program prints (the protocol of
// kubelet-devicemanager and dpkit-devicemanager).
type event struct {
	Event       string           `json:"event"`
	Time        int64            `json:"time"`
	Capacity    map[string]int64 `json:"capacity"`
	Allocatable map[string]int64 `json:"allocatable"`
	Deleted     []string         `json:"deleted"`
	Pod         string           `json:"pod"`
	UID         string           `json:"uid"`
	Container   string           `json:"container"`
	Admitted    bool             `json:"admitted"`
	Reason      string           `json:"reason"`
	Error       string           `json:"error"`
	Containers  []struct {
		Name      string              `json:"name"`
		DeviceIDs map[string][]string `json:"deviceIDs"`
	} `json:"containers"`
	Options *runOptions `json:"options"`
}

// runOptions is what a container runtime would receive.
type runOptions struct {
	Envs        map[string]string `json:"envs"`
	Annotations map[string]string `json:"annotations"`
	Mounts      []struct {
		ContainerPath string `json:"containerPath"`
		HostPath      string `json:"hostPath"`
		ReadOnly      bool   `json:"readOnly"`
	} `json:"mounts"`
	Devices []struct {
		ContainerPath string `json:"containerPath"`
		HostPath      string `json:"hostPath"`
		Permissions   string `json:"permissions"`
	} `json:"devices"`
	CDIDevices []string `json:"cdiDevices"`
}

// capSample is one capacity report and when the program made it.
type capSample struct {
	at       time.Time
	rendered string
}

// manager is one running device manager program.
type manager struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	logPath string
	replies chan event    // every event but capacity, in order
	done    chan struct{} // closed when the process has exited
	err     error         // the process's exit status, set before done closes

	mu      sync.Mutex
	lines   []string
	history []capSample
	changed chan struct{} // closed and replaced on each capacity report
}

// startManager starts bin with args, its log in logPath, and waits for
// its ready event.
func startManager(bin, logPath string, args ...string) (*manager, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := upstream.Command(bin, args...)
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	m := &manager{cmd: cmd, stdin: stdin, logPath: logPath, replies: make(chan event, 64),
		done: make(chan struct{}), changed: make(chan struct{})}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(m.replies)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			m.mu.Lock()
			m.lines = append(m.lines, sc.Text())
			m.mu.Unlock()
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = event{Event: "unparsed", Error: fmt.Sprintf("%v: %q", err, sc.Text())}
			}
			if e.Event == "capacity" {
				m.mu.Lock()
				m.history = append(m.history, capSample{at: time.Unix(0, e.Time), rendered: renderCapacity(e.Capacity, e.Allocatable)})
				close(m.changed)
				m.changed = make(chan struct{})
				m.mu.Unlock()
				continue
			}
			m.replies <- e
		}
	}()
	go func() {
		<-readerDone
		m.err = cmd.Wait()
		_ = logf.Close()
		close(m.done)
	}()
	ready, err := m.reply("ready", waitTimeout)
	if err != nil {
		m.kill()
		return nil, err
	}
	if ready.Event != "ready" {
		m.kill()
		return nil, fmt.Errorf("first event %q, want ready", ready.Event)
	}
	return m, nil
}

// renderCapacity prints capacity and allocatable as "R=cap/alloc ...",
// sorted, or "none".
func renderCapacity(capacity, allocatable map[string]int64) string {
	names := slices.Sorted(maps.Keys(capacity))
	for n := range allocatable {
		if _, ok := capacity[n]; !ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return "none"
	}
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s=%d/%d", n, capacity[n], allocatable[n])
	}
	return strings.Join(parts, " ")
}

// send writes one command and returns the reply.
func (m *manager) send(what string, timeout time.Duration, format string, args ...any) (event, error) {
	if _, err := fmt.Fprintf(m.stdin, format+"\n", args...); err != nil {
		return event{}, fmt.Errorf("write %q: %w", what, err)
	}
	return m.reply(what, timeout)
}

func (m *manager) reply(what string, timeout time.Duration) (event, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case e, ok := <-m.replies:
		if !ok {
			<-m.done
			return event{}, fmt.Errorf("device manager exited (%w) before %s; it printed:\n%s", m.err, what, m.output())
		}
		if e.Event == "error" || e.Event == "unparsed" {
			return e, fmt.Errorf("%s: protocol error: %s", what, e.Error)
		}
		return e, nil
	case <-t.C:
		return event{}, fmt.Errorf("no reply to %s in %v; it printed:\n%s", what, timeout, m.output())
	}
}

func (m *manager) output() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.lines, "\n")
}

// capacity returns the last capacity report and a channel closed at the
// next one.
func (m *manager) capacity() (capSample, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var last capSample
	if n := len(m.history); n > 0 {
		last = m.history[n-1]
	}
	return last, m.changed
}

// waitCapacity waits until the capacity reads want, or timeout; it
// returns the sample that matched or the last one seen.
func (m *manager) waitCapacity(want string, timeout time.Duration) (capSample, bool) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		cur, changed := m.capacity()
		if cur.rendered == want {
			return cur, true
		}
		select {
		case <-changed:
		case <-m.done:
			cur, _ := m.capacity()
			return cur, cur.rendered == want
		case <-deadline.C:
			cur, _ := m.capacity()
			return cur, cur.rendered == want
		}
	}
}

// stop sends sig and waits for the process to exit (killing it after
// 15 s). It returns the exit error for SIGTERM, nil for SIGKILL.
func (m *manager) stop(sig syscall.Signal) error {
	select {
	case <-m.done:
		return fmt.Errorf("device manager had already exited: %w", m.err)
	default:
	}
	_ = m.cmd.Process.Signal(sig)
	select {
	case <-m.done:
	case <-time.After(15 * time.Second):
		_ = m.cmd.Process.Kill()
		<-m.done
		return fmt.Errorf("device manager did not exit within 15 s of %v", sig)
	}
	if sig == syscall.SIGKILL {
		return nil
	}
	return m.err
}

func (m *manager) kill() {
	_ = m.cmd.Process.Kill()
	<-m.done
}

// raced reports whether the program's log holds a race detector report.
func (m *manager) raced() bool {
	data, err := os.ReadFile(m.logPath)
	return err == nil && strings.Contains(string(data), "WARNING: DATA RACE")
}
