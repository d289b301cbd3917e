package differential

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

// The managers write the checkpoint after each ListAndWatch message, in
// the stream's goroutine, after the new capacity is visible: a checkpoint
// read right after a capacity wait could race the write. So the steps
// that make a plugin send a list count the write it causes
// (side.expectWrite, into pendingWrites from the count writesBase), and
// the next capacity wait or checkpoint read waits for those writes
// (side.awaitWrites), observing "checkpoint not written after the device
// list" when they do not come. Writes are counted with inotify: both
// managers write a temporary file and rename it into place.

// writeCounter counts the checkpoint files moved into place in a
// directory (both managers write a temporary file and rename it).
type writeCounter struct {
	w       *fsnotify.Watcher
	done    chan struct{}
	mu      sync.Mutex
	n       int
	changed chan struct{}
}

func newWriteCounter(dir string) (*writeCounter, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	c := &writeCounter{w: w, done: make(chan struct{}), changed: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if filepath.Base(ev.Name) == checkpoint.FileName && ev.Has(fsnotify.Create) {
					c.mu.Lock()
					c.n++
					close(c.changed)
					c.changed = make(chan struct{})
					c.mu.Unlock()
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
			}
		}
	}()
	return c, nil
}

func (c *writeCounter) count() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.changed
}

// waitFor waits until at least n writes were counted, or timeout.
func (c *writeCounter) waitFor(n int, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		got, changed := c.count()
		if got >= n {
			return true
		}
		select {
		case <-changed:
		case <-deadline.C:
			return false
		}
	}
}

func (c *writeCounter) close() {
	_ = c.w.Close()
	<-c.done
}

// expectWrite notes that the step about to run makes a plugin send a
// ListAndWatch message, after which the managers write the checkpoint.
func (s *side) expectWrite() {
	if s.pendingWrites == 0 {
		s.writesBase, _ = s.writes.count()
	}
	s.pendingWrites++
}

// awaitWrites waits for the checkpoint writes of the device lists sent
// since the last wait; it observes nothing when they all happened.
func (s *side) awaitWrites() []string {
	if s.pendingWrites == 0 {
		return nil
	}
	ok := s.writes.waitFor(s.writesBase+s.pendingWrites, waitTimeout)
	s.pendingWrites = 0
	if !ok {
		return []string{notWritten}
	}
	return nil
}

// notWritten is observed when a device list sent to the manager was not
// followed by a checkpoint write.
const notWritten = "checkpoint not written after the device list"

// unexpectWrite takes back an expectWrite whose step sent no list.
func (s *side) unexpectWrite() {
	if s.pendingWrites > 0 {
		s.pendingWrites--
	}
}

// reregistering counts the running plugins that register again by
// themselves after a kubelet restart: SDK plugins, and plugins in
// plugins_registry (their sockets stay, the watcher finds them).
func (s *side) reregistering() int {
	n := 0
	for name, p := range s.plugins {
		if s.stopped[name] {
			continue
		}
		switch p := p.(type) {
		case *sdkPlugin:
			n++
		case *rawPlugin:
			if p.def.via == viaRegistry {
				n++
			}
		}
	}
	return n
}

// checkpointLines renders the side's checkpoint file: registered
// resources and pod entries, sorted (the kubelet writes both from Go
// maps), with Allocate answers decoded. Call awaitWrites first while the
// manager runs.
func (s *side) checkpointLines() []string {
	cp, err := checkpoint.Read(filepath.Join(s.pluginDir, checkpoint.FileName))
	if errors.Is(err, checkpoint.ErrNotFound) {
		return []string{"checkpoint: none"}
	}
	if err != nil {
		return []string{"checkpoint: unreadable: " + err.Error()}
	}
	var out []string
	for _, r := range slices.Sorted(maps.Keys(cp.Registered)) {
		out = append(out, fmt.Sprintf("checkpoint registered %s=%s", r, sortedList(cp.Registered[r])))
	}
	var entries []string
	for _, e := range cp.Entries {
		var numa []string
		for _, n := range slices.Sorted(maps.Keys(e.DeviceIDs)) {
			numa = append(numa, fmt.Sprintf("%d=%s", n, sortedList(e.DeviceIDs[n])))
		}
		resp := &pluginapi.ContainerAllocateResponse{}
		answer := ""
		if err := proto.Unmarshal(e.AllocResp, resp); err != nil {
			answer = "undecodable: " + err.Error()
		} else {
			answer = renderResponse(resp)
		}
		entries = append(entries, fmt.Sprintf("checkpoint entry %s/%s %s %s %s", e.PodUID, e.ContainerName, e.ResourceName, strings.Join(numa, " "), answer))
	}
	slices.Sort(entries)
	return append(out, entries...)
}

func renderResponse(r *pluginapi.ContainerAllocateResponse) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.Envs)) {
		parts = append(parts, "env "+k+"="+r.Envs[k])
	}
	for _, k := range slices.Sorted(maps.Keys(r.Annotations)) {
		parts = append(parts, "annotation "+k+"="+r.Annotations[k])
	}
	var ms, ds, cs []string
	for _, m := range r.Mounts {
		ms = append(ms, fmt.Sprintf("mount %s<-%s ro=%v", m.ContainerPath, m.HostPath, m.ReadOnly))
	}
	for _, d := range r.Devices {
		ds = append(ds, fmt.Sprintf("device %s<-%s %s", d.ContainerPath, d.HostPath, d.Permissions))
	}
	for _, c := range r.CdiDevices {
		cs = append(cs, "cdi "+c.Name)
	}
	slices.Sort(ms)
	slices.Sort(ds)
	slices.Sort(cs)
	parts = append(append(append(parts, ms...), ds...), cs...)
	return "{" + strings.Join(parts, "; ") + "}"
}
