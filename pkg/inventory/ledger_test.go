package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

const gi = int64(1) << 30

// gpuPlugin describes one 80Gi GPU, gpu-0: shared in memory shares, cut
// into seven 1g.10gb partitions or a 3g.40gb one, and offered to the
// device plugin front as four 20Gi replicas.
type gpuPlugin struct{ *fakePlugin }

func (gpuPlugin) devices() []deviceplugin.Device {
	var out []deviceplugin.Device
	for _, id := range append([]string{"gpu-0", "gpu-0-3g-0"}, slices.Concat(numbered("gpu-0-1g-", 7), numbered("gpu-0-r", 4))...) {
		out = append(out, deviceplugin.Device{ID: id, Healthy: true})
	}
	return out
}

func numbered(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(prefix, i)
	}
	return out
}

func (gpuPlugin) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	whole := deviceplugin.CounterUse{Set: "gpu-0", Counters: map[string]int64{"memory": 80 * gi, "slices": 7}}
	switch {
	case id == "gpu-0":
		return deviceplugin.DeviceInfo{Sharing: &deviceplugin.Sharing{
			Consumes: []deviceplugin.CounterUse{whole},
			Shared:   map[string]deviceplugin.SharedCapacity{"memory": {Total: 80 * gi, Default: 80 * gi, Min: gi, Step: gi}},
		}}, true
	case id == "gpu-0-3g-0":
		return deviceplugin.DeviceInfo{Sharing: &deviceplugin.Sharing{
			Consumes: []deviceplugin.CounterUse{{Set: "gpu-0", Counters: map[string]int64{"memory": 40 * gi, "slices": 3}}},
		}}, true
	case strings.HasPrefix(id, "gpu-0-1g-"):
		return deviceplugin.DeviceInfo{Sharing: &deviceplugin.Sharing{
			Consumes: []deviceplugin.CounterUse{{Set: "gpu-0", Counters: map[string]int64{"memory": 10 * gi, "slices": 1}}},
		}}, true
	case strings.HasPrefix(id, "gpu-0-r"):
		return deviceplugin.DeviceInfo{Sharing: &deviceplugin.Sharing{ShareOf: "gpu-0", ShareAmounts: map[string]int64{"memory": 20 * gi}}}, true
	}
	return deviceplugin.DeviceInfo{}, false
}

func (gpuPlugin) CounterSets() []deviceplugin.CounterSet {
	return []deviceplugin.CounterSet{{Name: "gpu-0", Counters: map[string]int64{"memory": 80 * gi, "slices": 7}}}
}

func newGPUInventory(t *testing.T) *Inventory {
	t.Helper()
	p := gpuPlugin{newFake()}
	inv := New("example.com/gpu", p, nil)
	inv.notify(p.devices())
	return inv
}

func claim(n int) Holder { return ClaimHolder("default", fmt.Sprint("c", n), fmt.Sprint("uid-", n)) }

var dpHolder = Holder{Front: FrontDevicePlugin, Owner: DevicePluginOwner}

func mustConflict(t *testing.T, err error, want ...string) {
	t.Helper()
	var ce *ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want a *ConflictError", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("err = %q, want it to say %q", err, w)
		}
	}
}

// TestLedgerPartitions: seven 1g partitions fit a GPU and nothing more;
// the whole GPU is refused while any partition is held, and a partition
// while the GPU is; the refusal names the holders and what is left.
func TestLedgerPartitions(t *testing.T) {
	inv := newGPUInventory(t)
	for i := range 5 {
		if err := inv.Acquire([]string{fmt.Sprint("gpu-0-1g-", i)}, claim(i)); err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
	}
	// 30Gi left: the 3g.40gb partition does not fit.
	mustConflict(t, inv.Acquire([]string{"gpu-0-3g-0"}, claim(10)), "40Gi of counter memory of gpu-0, 30Gi of 80Gi left", "ResourceClaim default/c0", "ResourceClaim default/c4")
	for i := 5; i < 7; i++ {
		if err := inv.Acquire([]string{fmt.Sprint("gpu-0-1g-", i)}, claim(i)); err != nil {
			t.Fatalf("partition %d: %v", i, err)
		}
	}
	mustConflict(t, inv.Acquire([]string{"gpu-0"}, claim(20)), "80Gi of counter memory of gpu-0, 10Gi of 80Gi left")
	for i := range 7 {
		inv.Release(claim(i))
	}
	if err := inv.Acquire([]string{"gpu-0"}, claim(20)); err != nil {
		t.Fatalf("whole GPU after the partitions ended: %v", err)
	}
	mustConflict(t, inv.Acquire([]string{"gpu-0-1g-0"}, claim(0)), "ResourceClaim default/c20")
	// A share of the GPU beside the whole of it does not fit either.
	mustConflict(t, inv.AcquireGrants([]Grant{{Device: "gpu-0", ShareID: "s", Amounts: map[string]int64{"memory": gi}}}, claim(21)), "memory 1Gi asked, 0 of 80Gi left")
}

// TestLedgerShares: shares of a shared device add up to its capacity and
// no more; an amount asked is rounded up to the granule; a share asking
// nothing takes the default, the whole device.
func TestLedgerShares(t *testing.T) {
	inv := newGPUInventory(t)
	share := func(i int, mem int64) Grant {
		return Grant{Device: "gpu-0", ShareID: fmt.Sprint("share-", i), Amounts: map[string]int64{"memory": mem}}
	}
	for i := range 4 {
		if err := inv.AcquireGrants([]Grant{share(i, 20*gi)}, claim(i)); err != nil {
			t.Fatalf("share %d: %v", i, err)
		}
	}
	mustConflict(t, inv.AcquireGrants([]Grant{share(4, 20*gi)}, claim(4)), "memory 20Gi asked, 0 of 80Gi left", "ResourceClaim default/c0", "ResourceClaim default/c3")
	// Acquiring a held share again is no new share.
	if err := inv.AcquireGrants([]Grant{share(0, 20*gi)}, claim(0)); err != nil {
		t.Fatalf("the same share again: %v", err)
	}
	// The shares took the GPU's counters once: no partition fits.
	mustConflict(t, inv.Acquire([]string{"gpu-0-1g-0"}, claim(5)), "counter memory of gpu-0")
	inv.Release(claim(0))
	// 20Gi left; 19.5Gi rounds up to 20Gi and fits, then nothing does.
	if err := inv.AcquireGrants([]Grant{share(6, 19*gi+gi/2)}, claim(6)); err != nil {
		t.Fatalf("a rounded share: %v", err)
	}
	mustConflict(t, inv.AcquireGrants([]Grant{share(7, 1)}, claim(7)), "memory 1Gi asked, 0 of 80Gi left")
	for i := range 7 {
		inv.Release(claim(i))
	}
	if err := inv.Acquire([]string{"gpu-0"}, claim(8)); err != nil {
		t.Fatal(err)
	}
	mustConflict(t, inv.AcquireGrants([]Grant{share(9, gi)}, claim(9)), "0 of 80Gi left")
	if err := inv.AcquireGrants([]Grant{{Device: "gpu-0", Amounts: map[string]int64{"cores": 1}}}, claim(10)); err == nil || !strings.Contains(err.Error(), `no shared capacity "cores"`) {
		t.Errorf("unknown capacity: err = %v", err)
	}
}

// TestLedgerReplicasAndShares: the device plugin front's replicas and DRA
// shares of one GPU never add up to more than it has, and each front sees
// only what still fits.
func TestLedgerReplicasAndShares(t *testing.T) {
	inv := newGPUInventory(t)
	f := &front{inv: inv}
	if view, _ := inv.devicePluginView(); slices.ContainsFunc(view, func(d deviceplugin.Device) bool { return d.ID == "gpu-0" }) {
		t.Error("the device plugin front offers gpu-0 itself; a shared device with replicas is offered through them")
	}
	if _, err := f.Allocate(t.Context(), []string{"gpu-0-r0"}); err != nil {
		t.Fatal(err)
	}
	devs, sets, _ := inv.DRAView()
	gpu := findDRA(t, devs, "gpu-0")
	if gpu.Capacity["memory"] != 60*gi || gpu.ChargesCounters {
		t.Errorf("published GPU = %+v, want 60Gi left and its counters taken in the sets", gpu)
	}
	if got := sets[0].Counters; got["memory"] != 0 || got["slices"] != 0 {
		t.Errorf("published set = %v, want it empty: the replica's GPU takes it all", got)
	}
	if slices.ContainsFunc(devs, func(d DRADevice) bool { return strings.Contains(d.ID, "-r") }) {
		t.Error("a replica is published through DRA; its shared device stands for it")
	}
	for i := range 3 {
		g := Grant{Device: "gpu-0", ShareID: fmt.Sprint("s", i), Amounts: map[string]int64{"memory": 20 * gi}}
		if err := inv.AcquireGrants([]Grant{g}, claim(i)); err != nil {
			t.Fatalf("share %d beside a replica: %v", i, err)
		}
	}
	mustConflict(t, inv.AcquireGrants([]Grant{{Device: "gpu-0", ShareID: "s3", Amounts: map[string]int64{"memory": 20 * gi}}}, claim(3)), "0 of 80Gi left", DevicePluginOwner)
	dpView, _ := inv.devicePluginView()
	var offered []string
	for _, d := range dpView {
		offered = append(offered, d.ID)
	}
	if !slices.Equal(offered, []string{"gpu-0-r0"}) {
		t.Errorf("device plugin front offers %v, want only the replica it holds", offered)
	}
	if _, err := f.Allocate(t.Context(), []string{"gpu-0-r1"}); err == nil {
		t.Error("a fifth 20Gi of an 80Gi GPU was allocated")
	}
	devs, sets, _ = inv.DRAView()
	if gpu := findDRA(t, devs, "gpu-0"); !gpu.ChargesCounters {
		t.Error("with claims holding shares, the scheduler charges the GPU's counters itself; the sets must not be less them too")
	}
	if got := sets[0].Counters["slices"]; got != 7 {
		t.Errorf("published slices = %d, want 7", got)
	}
}

// TestLedgerDevicePluginPartition: a partition the device plugin front
// holds is not published, and the counter set is published less it.
func TestLedgerDevicePluginPartition(t *testing.T) {
	inv := newGPUInventory(t)
	if err := inv.Acquire([]string{"gpu-0-1g-3"}, dpHolder); err != nil {
		t.Fatal(err)
	}
	devs, sets, _ := inv.DRAView()
	if slices.ContainsFunc(devs, func(d DRADevice) bool { return d.ID == "gpu-0-1g-3" }) {
		t.Error("a partition held through the device plugin front is published")
	}
	if got := sets[0].Counters; got["memory"] != 70*gi || got["slices"] != 6 {
		t.Errorf("published set = %v, want 70Gi and 6 slices", got)
	}
}

// TestLedgerAllOrNothing: a grant list with one that does not fit takes
// nothing.
func TestLedgerAllOrNothing(t *testing.T) {
	inv := newGPUInventory(t)
	if err := inv.Acquire([]string{"gpu-0-3g-0"}, claim(1)); err != nil {
		t.Fatal(err)
	}
	// 40Gi left: four 1g.10gb fit, the fifth does not.
	err := inv.Acquire([]string{"gpu-0-1g-0", "gpu-0-1g-1", "gpu-0-1g-2", "gpu-0-1g-3", "gpu-0-1g-4"}, claim(2))
	mustConflict(t, err, "gpu-0-1g-4", "0 of 80Gi left")
	if got := inv.Held(FrontDRA); !slices.Equal(got, []string{"gpu-0-3g-0"}) {
		t.Errorf("held = %v, want only the 3g partition", got)
	}
}

func findDRA(t *testing.T, devs []DRADevice, id string) DRADevice {
	t.Helper()
	for _, d := range devs {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("%s not published", id)
	return DRADevice{}
}

// TestDevicePluginOnly: served through the device plugin API alone, a
// shared device with replicas is offered as its replicas only, and a
// DRAOnly device not at all; the rest passes through.
func TestDevicePluginOnly(t *testing.T) {
	p := gpuPlugin{newFake()}
	dp := DevicePluginOnly(p)
	if _, ok := dp.(deviceplugin.PreferredAllocator); ok {
		t.Errorf("DevicePluginOnly of a plugin without PreferredAllocation implements it")
	}
	got := make(chan []deviceplugin.Device, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dp.Scan(ctx, func(d []deviceplugin.Device) { got <- d }) }()
	defer func() { cancel(); <-done }()
	p.snaps <- p.devices()
	var ids []string
	for _, d := range <-got {
		ids = append(ids, d.ID)
	}
	want := slices.Concat([]string{"gpu-0-3g-0"}, numbered("gpu-0-1g-", 7), numbered("gpu-0-r", 4))
	if !slices.Equal(ids, want) {
		t.Errorf("offered %v, want %v (not the shared gpu-0, which has replicas)", ids, want)
	}
	if plain := newFake(); DevicePluginOnly(plain) != deviceplugin.Plugin(plain) {
		t.Errorf("a plugin that describes nothing is wrapped")
	}
}
