package deviceplugin

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// snapshot is one immutable view of a resource's devices, shared by every
// reader until the next change replaces it.
type snapshot struct {
	version uint64
	byID    map[string]Device
	// msg is what ListAndWatch sends; size is its encoded size.
	msg  *pluginapi.ListAndWatchResponse
	size int
	// healthy and unhealthy count the devices by health.
	healthy, unhealthy int
}

// deviceSet holds the latest snapshot of one resource and wakes its
// watchers when it changes. Notify never blocks: every watcher has a
// one-slot channel, and a watcher that has not consumed the previous wake-up
// simply reads the newest snapshot when it gets to it (latest wins).
type deviceSet struct {
	mu       sync.Mutex
	cur      *snapshot
	watchers map[chan struct{}]struct{}
	// pushed are the watchers handed each snapshot on the goroutine
	// that made it (resource.pushDevices).
	pushed   map[*pushWatcher]struct{}
	onChange func(*snapshot)
}

func newDeviceSet(onChange func(*snapshot)) *deviceSet {
	return &deviceSet{
		cur:      buildSnapshot(0, nil),
		watchers: make(map[chan struct{}]struct{}),
		pushed:   make(map[*pushWatcher]struct{}),
		onChange: onChange,
	}
}

// update replaces the device set with devs. It reports whether anything
// changed; an identical snapshot wakes nobody.
func (s *deviceSet) update(devs []Device) bool {
	s.mu.Lock()
	if sameDevices(s.cur, devs) {
		s.mu.Unlock()
		return false
	}
	snap := buildSnapshot(s.cur.version+1, devs)
	s.cur = snap
	for ch := range s.watchers {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	pushed := s.pushedLocked()
	s.mu.Unlock()
	if s.onChange != nil {
		s.onChange(snap)
	}
	for _, w := range pushed {
		w.push()
	}
	return true
}

func (s *deviceSet) current() *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// watch registers a watcher; the returned channel receives a value after
// each change. cancel must be called when the watcher is done.
func (s *deviceSet) watch() (ch chan struct{}, cancel func()) {
	ch = make(chan struct{}, 1)
	s.mu.Lock()
	s.watchers[ch] = struct{}{}
	s.mu.Unlock()
	return ch, func() {
		s.mu.Lock()
		delete(s.watchers, ch)
		s.mu.Unlock()
	}
}

func sameDevices(cur *snapshot, devs []Device) bool {
	if len(cur.byID) != len(devs) {
		return false
	}
	for _, d := range devs {
		old, ok := cur.byID[d.ID]
		if !ok || old.Healthy != d.Healthy || !slices.Equal(old.NUMANodes, d.NUMANodes) {
			return false
		}
	}
	return true
}

func buildSnapshot(version uint64, devs []Device) *snapshot {
	s := &snapshot{
		version: version,
		byID:    make(map[string]Device, len(devs)),
		msg:     &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, 0, len(devs))},
	}
	for _, d := range devs {
		if _, dup := s.byID[d.ID]; dup {
			continue // checkDevices keeps lists with duplicates from getting here
		}
		d.NUMANodes = slices.Clone(d.NUMANodes)
		s.byID[d.ID] = d
		pd := &pluginapi.Device{ID: d.ID, Health: pluginapi.Unhealthy}
		if d.Healthy {
			pd.Health = pluginapi.Healthy
			s.healthy++
		} else {
			s.unhealthy++
		}
		if len(d.NUMANodes) > 0 {
			nodes := make([]*pluginapi.NUMANode, len(d.NUMANodes))
			for i, n := range d.NUMANodes {
				nodes[i] = &pluginapi.NUMANode{ID: n}
			}
			pd.Topology = &pluginapi.TopologyInfo{Nodes: nodes}
		}
		s.msg.Devices = append(s.msg.Devices, pd)
	}
	s.size = proto.Size(s.msg)
	return s
}

// maxDuplicates bounds how many duplicate IDs checkDevices names.
const maxDuplicates = 5

// checkDevices refuses a device list that names an ID more than once. The
// kubelet keys devices by ID: of two entries for one ID it keeps the last,
// and puts the ID in both its healthy and unhealthy sets when their health
// differs (devicemanager genericDeviceUpdateCallback). The error names each such ID and its entries, by index, health
// and NUMA nodes, so that the author can tell which source produced which.
func checkDevices(devs []Device) error {
	first := make(map[string]int, len(devs))
	var errs []error
	more := 0
	for i, d := range devs {
		j, dup := first[d.ID]
		if !dup {
			first[d.ID] = i
			continue
		}
		if len(errs) == maxDuplicates {
			more++
			continue
		}
		errs = append(errs, fmt.Errorf("device ID %q is listed twice: devices[%d] (%s) and devices[%d] (%s); give every device its own ID",
			d.ID, j, describeEntry(devs[j]), i, describeEntry(d)))
	}
	if more > 0 {
		errs = append(errs, fmt.Errorf("and %d more entries repeat an ID listed before them", more))
	}
	return errors.Join(errs...)
}

// describeEntry says what distinguishes one entry of a device list.
func describeEntry(d Device) string {
	health := "unhealthy"
	if d.Healthy {
		health = "healthy"
	}
	if len(d.NUMANodes) == 0 {
		return health + ", no NUMA node"
	}
	return fmt.Sprintf("%s, NUMA nodes %v", health, d.NUMANodes)
}

// pushWatcher hands a resource's device lists to send, on the goroutine
// that changed them, newest first and never one older than the last
// sent: ListAndWatch without a goroutine waiting on the stream
// (resource.pushDevices).
type pushWatcher struct {
	r     *resource
	send  func(*pluginapi.ListAndWatchResponse) error
	ended func(error)

	mu   sync.Mutex // held while a list is sent: sends come in order
	sent uint64
	done bool
}

// push sends the newest list unless it was sent; a send that fails ends
// the stream with its error as a status.
func (w *pushWatcher) push() {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	snap := w.r.devices.current()
	if snap.version == w.sent {
		w.mu.Unlock()
		return
	}
	err := overKubeletLimit(snap.msg)
	if err == nil {
		if serr := w.send(proto.Clone(snap.msg).(*pluginapi.ListAndWatchResponse)); serr != nil {
			err = status.Convert(serr).Err()
		} else {
			w.sent = snap.version
		}
	}
	w.mu.Unlock()
	if err != nil {
		w.finish(streamEndedByKubelet, err)
	}
}

// finish ends the stream once: the watcher is dropped, the stream
// counted closed as end says, and ended told err (none when err is nil:
// the receiver stopped it).
func (w *pushWatcher) finish(end streamEnd, err error) {
	w.mu.Lock()
	if w.done {
		w.mu.Unlock()
		return
	}
	w.done = true
	w.mu.Unlock()
	d := w.r.devices
	d.mu.Lock()
	delete(d.pushed, w)
	d.mu.Unlock()
	w.r.streamClosed(end)
	if err != nil {
		w.ended(err)
	}
}

// endPushed ends every pushed stream as the server's: the plugin stops.
func (s *deviceSet) endPushed() {
	s.mu.Lock()
	pushed := s.pushedLocked()
	s.mu.Unlock()
	for _, w := range pushed {
		w.finish(streamEndedByServer, io.EOF)
	}
}

// pushedLocked lists the pushed watchers, to be called on after s.mu is
// released (a send takes the receiver's locks).
func (s *deviceSet) pushedLocked() []*pushWatcher {
	out := make([]*pushWatcher, 0, len(s.pushed))
	for w := range s.pushed {
		out = append(out, w)
	}
	return out
}
