package differential

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// podSpec is a pod in the protocol's form. UIDs are "uid-<name>" on both
// sides, so checkpoints compare.
type podSpec struct {
	Name           string          `json:"name"`
	UID            string          `json:"uid"`
	InitContainers []containerSpec `json:"initContainers,omitempty"`
	Containers     []containerSpec `json:"containers"`
}

type containerSpec struct {
	Name        string           `json:"name"`
	Restartable bool             `json:"restartable,omitempty"`
	Limits      map[string]int64 `json:"limits,omitempty"`
}

// pod builds a pod with app containers.
func pod(name string, containers ...containerSpec) podSpec {
	return podSpec{Name: name, UID: "uid-" + name, Containers: containers}
}

// withInit adds init containers.
func (p podSpec) withInit(cs ...containerSpec) podSpec {
	p.InitContainers = append(slices.Clone(p.InitContainers), cs...)
	return p
}

// ctr is a container asking for resources: ctr("main", "example.com/a", 2, ...).
func ctr(name string, resourceCounts ...any) containerSpec {
	c := containerSpec{Name: name, Limits: map[string]int64{}}
	for i := 0; i+1 < len(resourceCounts); i += 2 {
		c.Limits[resourceCounts[i].(string)] = int64(resourceCounts[i+1].(int))
	}
	return c
}

func sidecar(name string, resourceCounts ...any) containerSpec {
	c := ctr(name, resourceCounts...)
	c.Restartable = true
	return c
}

// kubeletStarts starts the side's device manager.
func kubeletStarts() step {
	return step{what: "the device manager starts", do: func(s *side) ([]string, error) {
		return nil, s.startManager()
	}}
}

// kubeletStops stops the device manager with SIGTERM and observes the
// checkpoint it leaves; every scenario ends with it.
func kubeletStops() step {
	return step{what: "the device manager stops (SIGTERM); checkpoint", do: func(s *side) ([]string, error) {
		lines := s.awaitWrites()
		if err := s.stopManager(syscall.SIGTERM); err != nil {
			return nil, err
		}
		return append(lines, s.checkpointLines()...), nil
	}}
}

// restart stops the device manager with sig, observes the checkpoint it
// left, and starts it again knowing the live pods (--pods), as a
// restarted kubelet knows its pods.
func restart(sig syscall.Signal) step {
	return step{what: fmt.Sprintf("the device manager restarts (%s); checkpoint", sigName(sig)), do: func(s *side) ([]string, error) {
		lines := s.awaitWrites()
		if err := s.stopManager(sig); err != nil {
			return nil, err
		}
		lines = append(lines, s.checkpointLines()...)
		return lines, s.startManager()
	}}
}

func sigName(sig syscall.Signal) string {
	if sig == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGTERM"
}

// startPlugin starts a plugin. A raw plugin serves and registers (on
// kubelet.sock: the answer is observed; through plugins_registry: the
// status the plugin watcher reports is observed); an SDK plugin registers
// on its own.
func startPlugin(def pluginDef) step {
	kind := "raw"
	if def.sdk {
		kind = "sdk"
	}
	return step{what: fmt.Sprintf("plugin %s (%s, %s) starts via %s", def.name, kind, def.resource, def.via), do: func(s *side) ([]string, error) {
		if _, dup := s.plugins[def.name]; dup {
			return nil, fmt.Errorf("plugin %s started twice", def.name)
		}
		if def.sdk {
			s.expectWrite()
			p, err := startSDKPlugin(s, def, s.log)
			if err != nil {
				return nil, err
			}
			s.addPlugin(def.name, p)
			return nil, nil
		}
		p := newRawPlugin(s, def)
		s.addPlugin(def.name, p)
		return p.serveAndRegister(), nil
	}}
}

func (s *side) addPlugin(name string, p plugin) {
	s.plugins[name] = p
	s.order = append(s.order, name)
}

// serveAndRegister serves the plugin's socket and registers it (on
// kubelet.sock, or by waiting for the plugin watcher), and observes the
// answer. An accepted plugin sends its list, which the managers
// checkpoint.
func (p *rawPlugin) serveAndRegister() []string {
	s := p.s
	if !p.def.holdList {
		s.expectWrite()
	}
	if err := p.serve(); err != nil {
		return []string{p.def.name + " serve: " + err.Error()}
	}
	var answer string
	if p.def.via == viaRegistry {
		answer = p.def.name + " registration: " + p.waitStatus()
		if !strings.HasSuffix(answer, ": registered") && !p.def.holdList {
			s.unexpectWrite()
		}
	} else {
		answer = p.def.name + " register: " + p.register()
		if !strings.HasSuffix(answer, ": ok") && !p.def.holdList {
			s.unexpectWrite()
		}
	}
	return []string{answer}
}

func (p *rawPlugin) waitStatus() string {
	select {
	case st := <-p.statuses:
		return st
	case <-time.After(waitTimeout):
		return timedOut + fmt.Sprintf(": no registration status within %v", waitTimeout)
	}
}

func rawOf(s *side, name string) (*rawPlugin, error) {
	p, ok := s.plugins[name].(*rawPlugin)
	if !ok {
		return nil, fmt.Errorf("%s is not a raw plugin", name)
	}
	return p, nil
}

func sdkOf(s *side, name string) (*sdkPlugin, error) {
	p, ok := s.plugins[name].(*sdkPlugin)
	if !ok {
		return nil, fmt.Errorf("%s is not an SDK plugin", name)
	}
	return p, nil
}

// register makes a raw plugin call Register again, on the socket it
// serves now.
func register(name string) step {
	return step{what: "plugin " + name + " registers on kubelet.sock", do: func(s *side) ([]string, error) {
		p, err := rawOf(s, name)
		if err != nil {
			return nil, err
		}
		s.expectWrite()
		answer := name + " register: " + p.register()
		if !strings.HasSuffix(answer, ": ok") {
			s.unexpectWrite()
		}
		return []string{answer}, nil
	}}
}

// serveAgain makes a raw plugin serve its socket again (after a kubelet
// restart removed it) and register.
func serveAgain(name string) step {
	return step{what: "plugin " + name + " serves its socket again and registers", do: func(s *side) ([]string, error) {
		p, err := rawOf(s, name)
		if err != nil {
			return nil, err
		}
		return p.serveAndRegister(), nil
	}}
}

// releaseList lets a raw plugin with holdList send its device list.
func releaseList(name string) step {
	return step{what: "plugin " + name + " sends its first list", do: func(s *side) ([]string, error) {
		p, err := rawOf(s, name)
		if err != nil {
			return nil, err
		}
		s.expectWrite()
		p.releaseList()
		return nil, nil
	}}
}

// list makes a plugin send a new device list.
func list(name string, devs ...dev) step {
	ids := make([]string, len(devs))
	for i, d := range devs {
		ids[i] = d.id
		if d.health != "Healthy" {
			ids[i] += "(" + d.health + ")"
		}
	}
	return step{what: fmt.Sprintf("plugin %s lists %s", name, sortedList(ids)), do: func(s *side) ([]string, error) {
		p, ok := s.plugins[name]
		if !ok {
			return nil, fmt.Errorf("no plugin %s", name)
		}
		s.expectWrite()
		p.setDevices(devs)
		return nil, nil
	}}
}

// stopPlugin stops a plugin: its streams end and its socket goes.
func stopPlugin(name string) step {
	return step{what: "plugin " + name + " stops", do: func(s *side) ([]string, error) {
		p, ok := s.plugins[name]
		if !ok {
			return nil, fmt.Errorf("no plugin %s", name)
		}
		s.mark = time.Now()
		s.stopped[name] = true
		p.stop()
		return nil, nil
	}}
}

// endStreams makes a raw plugin end its ListAndWatch streams while it
// keeps serving.
func endStreams(name string) step {
	return step{what: "plugin " + name + " ends its ListAndWatch stream", do: func(s *side) ([]string, error) {
		p, err := rawOf(s, name)
		if err != nil {
			return nil, err
		}
		p.endStreams()
		return nil, nil
	}}
}

// removeSocket deletes a plugin's socket file behind its back.
func removeSocket(name string) step {
	return step{what: "the socket of plugin " + name + " is deleted", do: func(s *side) ([]string, error) {
		switch p := s.plugins[name].(type) {
		case *rawPlugin:
			return nil, os.Remove(p.socket)
		case *sdkPlugin:
			// It registers again with a new connection, and lists.
			s.expectWrite()
			s.regMark[name] = p.registrations("success")
			st := p.srv.Status()
			if len(st) != 1 {
				return nil, fmt.Errorf("plugin %s serves %d resources", name, len(st))
			}
			return nil, os.Remove(st[0].Socket)
		}
		return nil, fmt.Errorf("no plugin %s", name)
	}}
}

// registeredAgain waits until an SDK plugin registered on kubelet.sock
// again since its socket was deleted, and observes its registration
// state.
func registeredAgain(name string) step {
	return step{what: "plugin " + name + " registers again", do: func(s *side) ([]string, error) {
		p, err := sdkOf(s, name)
		if err != nil {
			return nil, err
		}
		// The plugin's metrics are the only outside view of its
		// registrations; poll them, as the e2e tests poll the API.
		err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, waitTimeout, true, func(context.Context) (bool, error) {
			return p.registrations("success") > s.regMark[name], nil
		})
		if err != nil {
			s.unexpectWrite()
			st := p.srv.Status()[0]
			return []string{fmt.Sprintf("%s: not registered again within %v; last error: %v", name, waitTimeout, st.LastError)}, nil
		}
		// The manager lists the plugin's devices on the new connection
		// and writes the checkpoint; wait for that write, so that a list
		// the next step sends is not folded into the first one (the
		// plugin would then send one list, and the managers write once).
		return append([]string{name + ": registered again"}, s.awaitWrites()...), nil
	}}
}

// expect waits until the capacity reads want ("R=capacity/allocatable
// ...", sorted, or "none").
func expect(want string) step {
	return step{what: "capacity becomes " + want, do: func(s *side) ([]string, error) {
		got, ok := s.mgr.waitCapacity(want, waitTimeout)
		if !ok {
			// The lists were not applied as expected; their writes are
			// not waited for either.
			s.pendingWrites = 0
			return []string{fmt.Sprintf("%s: capacity did not become %s within %v; last: %s", timedOut, want, waitTimeout, got.rendered)}, nil
		}
		return append([]string{"capacity " + got.rendered}, s.awaitWrites()...), nil
	}}
}

// capacityNow asks for the capacity now, changed or not: for states that
// must hold after an earlier step, such as a device list not yet sent.
func capacityNow() step {
	return step{what: "capacity now", do: func(s *side) ([]string, error) {
		_, changed := s.mgr.capacity()
		if _, err := fmt.Fprintln(s.mgr.stdin, "capacity"); err != nil {
			return nil, err
		}
		select {
		case <-changed:
		case <-time.After(waitTimeout):
			return nil, fmt.Errorf("%s: no capacity report within %v of asking", s.name, waitTimeout)
		}
		// A poll may have printed just before the answer; both show the
		// state at or after the question.
		got, _ := s.mgr.capacity()
		return []string{"capacity " + got.rendered}, nil
	}}
}

// graceExpires waits (up to the grace period and a bit) until the
// capacity reads want, and observes whether that took the kubelet's
// grace period (5 minutes) from the last plugin stop.
func graceExpires(want string) step {
	const grace, slack = 5 * time.Minute, 5 * time.Second
	return step{what: "after the grace period capacity becomes " + want, do: func(s *side) ([]string, error) {
		got, ok := s.mgr.waitCapacity(want, grace+slack+waitTimeout)
		if !ok {
			return []string{fmt.Sprintf("%s: capacity did not become %s within %v of the plugin stop; last: %s", timedOut, want, grace+slack+waitTimeout, got.rendered)}, nil
		}
		took := got.at.Sub(s.mark)
		when := "after the grace period"
		switch {
		case took < grace:
			when = fmt.Sprintf("before the grace period (%v after the plugin stopped)", took.Round(time.Millisecond))
		case took > grace+slack:
			when = fmt.Sprintf("late (%v after the plugin stopped)", took.Round(time.Millisecond))
		}
		return []string{fmt.Sprintf("capacity %s %s", got.rendered, when)}, nil
	}}
}

// admit admits a pod and observes the result and the plugin calls it
// caused.
func admit(p podSpec) step {
	return step{what: "admit " + describePod(p), do: func(s *side) ([]string, error) {
		data, err := json.Marshal(p)
		if err != nil {
			return nil, err
		}
		e, err := s.mgr.send("admission of "+p.Name, 2*waitTimeout, "admit %s", data)
		if err != nil {
			return nil, err
		}
		var out []string
		if !e.Admitted {
			out = append(out, fmt.Sprintf("admit %s: rejected %s: %s", p.Name, e.Reason, e.Error))
			s.setLive(p, false)
		} else {
			out = append(out, "admit "+p.Name+": admitted")
			for _, c := range e.Containers {
				out = append(out, "  "+c.Name+": "+renderIDs(c.DeviceIDs))
			}
			s.setLive(p, true)
		}
		return append(out, s.drainCalls()...), nil
	}}
}

func describePod(p podSpec) string {
	var parts []string
	for _, c := range p.InitContainers {
		kind := "init"
		if c.Restartable {
			kind = "sidecar"
		}
		parts = append(parts, fmt.Sprintf("%s %s %s", kind, c.Name, renderLimits(c.Limits)))
	}
	for _, c := range p.Containers {
		parts = append(parts, fmt.Sprintf("%s %s", c.Name, renderLimits(c.Limits)))
	}
	return p.Name + " (" + strings.Join(parts, ", ") + ")"
}

func renderLimits(l map[string]int64) string {
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, fmt.Sprintf("%s=%d", r, l[r]))
	}
	return strings.Join(parts, ",")
}

func renderIDs(ids map[string][]string) string {
	if len(ids) == 0 {
		return "no devices"
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(ids)) {
		parts = append(parts, r+"="+sortedList(ids[r]))
	}
	return strings.Join(parts, " ")
}

// start asks for a container's runtime options as the kubelet does before
// starting it (PreStartContainer included), and observes them with the
// plugin calls.
func start(podName, container string) step {
	return step{what: "start " + podName + "/" + container, do: func(s *side) ([]string, error) {
		e, err := s.mgr.send("start of "+podName+"/"+container, 2*waitTimeout, "start %s %s", podName, container)
		if err != nil {
			return nil, err
		}
		head := "start " + podName + "/" + container + ": "
		var out []string
		switch {
		case e.Error != "":
			out = []string{head + "error: " + e.Error}
		case e.Options == nil:
			out = []string{head + "no device options"}
		default:
			out = append([]string{head + "ok"}, renderOptions(e.Options)...)
		}
		return append(out, s.drainCalls()...), nil
	}}
}

func renderOptions(o *runOptions) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(o.Envs)) {
		out = append(out, "  env "+k+"="+o.Envs[k])
	}
	for _, k := range slices.Sorted(maps.Keys(o.Annotations)) {
		out = append(out, "  annotation "+k+"="+o.Annotations[k])
	}
	for _, m := range o.Mounts {
		out = append(out, fmt.Sprintf("  mount %s<-%s ro=%v", m.ContainerPath, m.HostPath, m.ReadOnly))
	}
	for _, d := range o.Devices {
		out = append(out, fmt.Sprintf("  device %s<-%s %s", d.ContainerPath, d.HostPath, d.Permissions))
	}
	for _, c := range o.CDIDevices {
		out = append(out, "  cdi "+c)
	}
	return out
}

// deletePod deletes a pod; its devices are free again.
func deletePod(name string) step {
	return step{what: "delete " + name, do: func(s *side) ([]string, error) {
		if _, err := s.mgr.send("delete of "+name, waitTimeout, "delete %s", name); err != nil {
			return nil, err
		}
		s.live = slices.DeleteFunc(s.live, func(p podSpec) bool { return p.Name == name })
		return nil, nil
	}}
}

// checkpointNow observes the checkpoint file while the manager runs; use
// it only after steps that write it before answering (admission).
func checkpointNow() step {
	return step{what: "checkpoint", do: func(s *side) ([]string, error) {
		return append(s.awaitWrites(), s.checkpointLines()...), nil
	}}
}
