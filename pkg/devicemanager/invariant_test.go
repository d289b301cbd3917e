package devicemanager

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
)

// TestInvariantRandomOperations interleaves admissions, deletions, health
// changes, plugin restarts and manager restarts (Stop, then a new Manager
// on the same root restoring the checkpoint) and checks after every step
// that no device is held by two pods, that free devices are healthy and
// unheld, and that restarts preserve every assignment.
func TestInvariantRandomOperations(t *testing.T) {
	seed := int64(20260101)
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	dir := testdir.Short(t, "dm")
	ids := []string{"d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7"}
	health := map[string]bool{}
	for _, id := range ids {
		health[id] = true
	}
	devices := func() []*pluginapi.Device {
		out := make([]*pluginapi.Device, len(ids))
		for i, id := range ids {
			h := pluginapi.Unhealthy
			if health[id] {
				h = pluginapi.Healthy
			}
			out[i] = &pluginapi.Device{ID: id, Health: h, Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}}
		}
		return out
	}
	healthyCount := func() int64 {
		n := int64(0)
		for _, h := range health {
			if h {
				n++
			}
		}
		return n
	}
	newMgr := func() *Manager {
		m, err := New(Config{Root: dir, Logger: testLogger(t), TopologyPolicy: "best-effort", NUMANodes: []int{0, 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := newMgr()
	defer func() { m.Stop() }()
	var plug *stubPlugin
	startPlugin := func() {
		plug = newStub(t, PluginDir(dir), res, "dev.sock", &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: rng.Intn(2) == 0}, devices())
		plug.prefer = func(r *pluginapi.ContainerPreferredAllocationRequest) []string {
			// A plugin that answers with a random subset, sometimes wrong.
			out := append([]string(nil), r.MustIncludeDeviceIDs...)
			for _, id := range r.AvailableDeviceIDs {
				if rng.Intn(3) == 0 {
					out = append(out, id)
				}
			}
			return out
		}
		plug.register(t, m.SocketPath())
		waitFor(t, m, "plugin connected", func() bool {
			r := m.Resources()
			return len(r) == 1 && r[0].Connected && r[0].Allocatable == healthyCount()
		})
	}
	startPlugin()
	live := map[string]bool{}
	podN := 0
	for step := 0; step < 150; step++ {
		op := rng.Intn(10)
		switch {
		case op < 5: // admit
			podN++
			uid := fmt.Sprintf("pod-%d", podN)
			var cs []ctr
			for i, n := 0, rng.Intn(2); i < n; i++ {
				side := rng.Intn(3) == 0
				name := fmt.Sprint("init", i)
				if side {
					name = fmt.Sprint("side", i)
				}
				cs = append(cs, ctr{name: name, req: map[string]int64{res: int64(rng.Intn(3))}, init: true, restartOK: side})
			}
			for i, n := 0, 1+rng.Intn(2); i < n; i++ {
				cs = append(cs, ctr{name: fmt.Sprint("app", i), req: map[string]int64{res: int64(rng.Intn(3))}})
			}
			if _, err := m.Admit(context.Background(), makePod(uid, cs...)); err == nil {
				live[uid] = true
			} else if ae := (*AdmissionError)(nil); !errors.As(err, &ae) {
				t.Fatalf("step %d: Admit returned an untyped error: %v", step, err)
			}
		case op < 7: // delete
			for uid := range live {
				m.RemovePod(types.UID(uid))
				delete(live, uid)
				break
			}
		case op < 8: // health flip
			id := ids[rng.Intn(len(ids))]
			health[id] = !health[id]
			plug.setDevices(devices())
			waitFor(t, m, "health change", func() bool { return allocatable(m, res) == healthyCount() })
		case op < 9: // plugin restart
			plug.stop()
			waitFor(t, m, "plugin gone", func() bool { return !m.Resources()[0].Connected })
			startPlugin()
		default: // manager restart
			before := m.Pods()
			m.Stop()
			plug.stop()
			m = newMgr()
			after := m.Pods()
			if len(before) != len(after) {
				t.Fatalf("step %d: %d pods before restart, %d after", step, len(before), len(after))
			}
			for i := range before {
				if !sameAllocation(&before[i], &after[i]) {
					t.Fatalf("step %d: allocation changed across restart: %+v vs %+v", step, before[i], after[i])
				}
			}
			startPlugin()
		}
		checkInvariant(t, m)
		for _, pa := range m.Pods() {
			if !live[pa.PodUID] {
				t.Fatalf("step %d: pod %s holds devices but was not admitted or was removed", step, pa.PodUID)
			}
		}
	}
}
