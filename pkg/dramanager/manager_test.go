package dramanager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/pkg/dramanager/checkpoint"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		dratest.RemoveBinary()
		os.Exit(code)
	}))
}

func checkpointed(t *testing.T, n *node) []checkpoint.ClaimState {
	t.Helper()
	cs, err := checkpoint.Read(filepath.Join(n.root, checkpoint.FileName))
	if errors.Is(err, checkpoint.ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestPrepareUnprepareBatched: a pod's two claims of one driver go in one
// NodePrepareResources call, the container gets their CDI devices, and
// one NodeUnprepareResources call releases both.
func TestPrepareUnprepareBatched(t *testing.T) {
	n := newNode(t, "", nil)
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	n.claims.Add(t, "default", "b", "uid-b", []types.UID{"pod-1"}, "dev-1")
	pod := dratest.Pod("default", "p", "pod-1", "a", "b")
	ctx := context.Background()

	if err := n.m.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	method, uids := d.NextCall(t)
	slices.Sort(uids)
	if method != "NodePrepareResources" || !reflect.DeepEqual(uids, []string{"uid-a", "uid-b"}) {
		t.Fatalf("driver got %s %v, want one NodePrepareResources with both claims", method, uids)
	}
	cdi, err := n.m.CDIDevices(pod, &pod.Spec.Containers[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"fake.dpkit.io/device=dev-0", "fake.dpkit.io/device=dev-1"}; !reflect.DeepEqual(cdi, want) {
		t.Fatalf("CDIDevices = %v, want %v", cdi, want)
	}
	cs := checkpointed(t, n)
	if len(cs) != 2 || !cs[0].PodUIDs.Has("pod-1") || len(cs[0].DriverState[driverName].Devices) != 1 {
		t.Fatalf("checkpoint = %+v, want both claims with pod-1 and their devices", cs)
	}
	// Prepared claims are not sent again.
	if err := n.m.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}

	if err := n.m.UnprepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	method, uids = d.NextCall(t)
	slices.Sort(uids)
	if method != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-a", "uid-b"}) {
		t.Fatalf("driver got %s %v, want one NodeUnprepareResources with both claims", method, uids)
	}
	if cs := checkpointed(t, n); len(cs) != 0 {
		t.Fatalf("checkpoint after unprepare = %+v, want empty", cs)
	}
	if n.m.PodMightNeedToUnprepareResources("pod-1") {
		t.Fatal("pod still referenced after unprepare")
	}
	d.NoMoreCalls(t)
}

// TestSharedClaimUnpreparedByLastPod: a claim two pods use is released
// when the second one goes.
func TestSharedClaimUnpreparedByLastPod(t *testing.T) {
	n := newNode(t, "", nil)
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "shared", "uid-s", []types.UID{"pod-1", "pod-2"}, "dev-0")
	p1, p2 := dratest.Pod("default", "p1", "pod-1", "shared"), dratest.Pod("default", "p2", "pod-2", "shared")
	ctx := context.Background()
	for _, p := range []*corev1.Pod{p1, p2} {
		if err := n.m.PrepareResources(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := d.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}
	if err := n.m.UnprepareResources(ctx, p1); err != nil {
		t.Fatal(err)
	}
	if cs := checkpointed(t, n); len(cs) != 1 || cs[0].PodUIDs.Has("pod-1") || !cs[0].PodUIDs.Has("pod-2") {
		t.Fatalf("checkpoint = %+v, want the claim with pod-2 only", cs)
	}
	if err := n.m.UnprepareResources(ctx, p2); err != nil {
		t.Fatal(err)
	}
	if m, uids := d.NextCall(t); m != "NodeUnprepareResources" || len(uids) != 1 {
		t.Fatalf("call %s %v", m, uids)
	}
	d.NoMoreCalls(t)
}

// TestPrepareFailsWithoutChange: a pod whose claims cannot be used is
// refused before the cache changes or a driver is called.
func TestPrepareFailsWithoutChange(t *testing.T) {
	n := newNode(t, "", nil)
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "other", "uid-o", []types.UID{"pod-9"}, "dev-0")
	c := n.claims.Add(t, "default", "unalloc", "uid-u", []types.UID{"pod-1"})
	c.Status.Allocation = nil
	ctx := context.Background()
	for _, tc := range []struct {
		name, claim, want string
	}{
		{"missing", "nope", "fetch ResourceClaim nope"},
		{"not reserved", "other", "not allowed to use ResourceClaim other"},
	} {
		err := n.m.PrepareResources(ctx, dratest.Pod("default", "p", "pod-1", tc.claim))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
	if cs := checkpointed(t, n); len(cs) != 0 {
		t.Fatalf("checkpoint = %+v after refused pods, want empty", cs)
	}
	d.NoMoreCalls(t)
}

// TestUnregisteredDriver: a claim of a driver that is not registered fails
// naming it, and leaves nothing to unprepare.
func TestUnregisteredDriver(t *testing.T) {
	n := newNode(t, "", nil)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	err := n.m.PrepareResources(context.Background(), dratest.Pod("default", "p", "pod-1", "a"))
	if !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("err = %v, want ErrNotRegistered", err)
	}
	// The kubelet's message, word for word (test/e2e/dra_sidebyside_test.go
	// compares it with the kubelet's own).
	if want := "prepare dynamic resources: DRA driver " + driverName + " is not registered"; err.Error() != want {
		t.Fatalf("err = %q, want %q", err, want)
	}
	if cs := checkpointed(t, n); len(cs) != 0 {
		t.Fatalf("checkpoint = %+v, want empty", cs)
	}
}

// TestCheckpointBeforeDriverAndReconcile: the pod's reference is
// checkpointed before the driver is called, so when the driver fails and
// the pod goes away, Reconcile unprepares the claim.
func TestCheckpointBeforeDriverAndReconcile(t *testing.T) {
	n := newNode(t, "", nil)
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	d.Send(t, "fail-prepare out of widgets")
	ctx := context.Background()
	err := n.m.PrepareResources(ctx, dratest.Pod("default", "p", "pod-1", "a"))
	if err == nil || !strings.Contains(err.Error(), "out of widgets") {
		t.Fatalf("err = %v, want the driver's error", err)
	}
	if m, _ := d.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}
	cs := checkpointed(t, n)
	if len(cs) != 1 || !cs[0].PodUIDs.Has("pod-1") || len(cs[0].DriverState[driverName].Devices) != 0 {
		t.Fatalf("checkpoint = %+v, want the claim referenced by pod-1 without devices", cs)
	}
	if err := n.m.Reconcile(ctx, []types.UID{"pod-1"}); err != nil {
		t.Fatal(err)
	}
	if err := n.m.Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if m, uids := d.NextCall(t); m != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-a"}) {
		t.Fatalf("call %s %v, want NodeUnprepareResources [uid-a]", m, uids)
	}
	if cs := checkpointed(t, n); len(cs) != 0 {
		t.Fatalf("checkpoint = %+v, want empty", cs)
	}
	d.NoMoreCalls(t)
}

// TestRestoreFromCheckpoint: a manager started on the root of one that
// prepared a claim serves its CDI devices without calling the driver, and
// unprepares it when the pod ends.
func TestRestoreFromCheckpoint(t *testing.T) {
	n := newNode(t, "", nil)
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-1")
	pod := dratest.Pod("default", "p", "pod-1", "a")
	ctx := context.Background()
	if err := n.m.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}
	n.stop()

	n2 := newNode(t, n.root, nil)
	cdi, err := n2.m.CDIDevices(pod, &pod.Spec.Containers[0])
	if err != nil || !reflect.DeepEqual(cdi, []string{"fake.dpkit.io/device=dev-1"}) {
		t.Fatalf("restored CDIDevices = %v, %v", cdi, err)
	}
	n2.waitPlugins(t, 1)
	if err := n2.m.UnprepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if m, uids := d.NextCall(t); m != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-a"}) {
		t.Fatalf("call %s %v, want NodeUnprepareResources [uid-a] and no second prepare", m, uids)
	}
	d.NoMoreCalls(t)
}

// TestRegistrationRefusals covers the handler's answers without a driver.
func TestRegistrationRefusals(t *testing.T) {
	n := newNode(t, "", nil)
	h := n.m.PluginHandler()
	ctx := context.Background()
	ep := filepath.Join(n.root, "plugins", "x", "dra.sock")
	for _, tc := range []struct {
		name     string
		versions []string
		want     string
	}{
		{"empty", nil, "empty list of supported gRPC services"},
		{"unknown", []string{"v2.DRAPlugin", drahealthv1.DRAResourceHealthService}, "none of services supported"},
	} {
		if err := h.ValidatePlugin(ctx, "x", ep, tc.versions); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ValidatePlugin = %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := h.RegisterPlugin(ctx, "x", ep, []string{drav1beta1.DRAPluginService, drav1.DRAPluginService}); err != nil {
		t.Fatal(err)
	}
	if err := h.RegisterPlugin(ctx, "x", ep, []string{drav1.DRAPluginService}); err == nil || !strings.Contains(err.Error(), "already registered") {
		t.Fatalf("second registration on the same endpoint = %v, want refused", err)
	}
	ep2 := filepath.Join(n.root, "plugins", "x", "dra-2.sock")
	if err := h.RegisterPlugin(ctx, "x", ep2, []string{drav1.DRAPluginService, "v1alpha1.DRAResourceHealth", drahealthv1.DRAResourceHealthService}); err != nil {
		t.Fatalf("rolling-update registration: %v", err)
	}
	ps := n.m.Plugins()
	if len(ps) != 2 || ps[0].Service != drav1beta1.DRAPluginService || ps[1].Service != drav1.DRAPluginService || ps[1].HealthService != drahealthv1.DRAResourceHealthService {
		t.Fatalf("plugins = %+v, want the driver's first known service and the newest health service", ps)
	}
	h.DeRegisterPlugin(ctx, "x", ep)
	if ps := n.m.Plugins(); len(ps) != 1 || ps[0].Endpoint != ep2 {
		t.Fatalf("plugins after deregistration = %+v", ps)
	}
}

// TestV1beta1Driver: a driver serving only v1beta1 is called in v1beta1.
func TestV1beta1Driver(t *testing.T) {
	n := newNode(t, "", nil)
	d := n.startDriver(t, "--v1beta1-only")
	ps := n.waitPlugins(t, 1)
	if ps[0].Service != drav1beta1.DRAPluginService {
		t.Fatalf("service %s, want %s", ps[0].Service, drav1beta1.DRAPluginService)
	}
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	if err := n.m.PrepareResources(context.Background(), dratest.Pod("default", "p", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}
}

// TestRollingUpdate: two instances of a driver are both registered; the
// newest connected one is called; when it goes the old one still serves.
func TestRollingUpdate(t *testing.T) {
	n := newNode(t, "", nil)
	old := n.startDriver(t, "--rolling-update", "old-pod")
	n.waitPlugins(t, 1)
	nu := n.startDriver(t, "--rolling-update", "new-pod")
	n.waitPlugins(t, 2)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	ctx := context.Background()
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "p", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	if m, _ := nu.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}
	nu.NoMoreCalls(t) // the new instance stops: its registration goes
	n.waitPlugins(t, 1)
	if err := n.m.UnprepareResources(ctx, dratest.Pod("default", "p", "pod-1", "a")); err != nil {
		t.Fatal(err)
	}
	if m, _ := old.NextCall(t); m != "NodeUnprepareResources" {
		t.Fatalf("call %s", m)
	}
	old.NoMoreCalls(t)
}

// armed waits until the health expiry timer is armed for want.
func armed(t *testing.T, timers <-chan time.Time, want time.Time) {
	t.Helper()
	for {
		select {
		case at := <-timers:
			if at.Equal(want) {
				return
			}
		case <-time.After(time.Minute):
			t.Fatalf("the health expiry timer was not armed for %v within a minute", want)
		}
	}
}

// TestHealthUnknownAfterTimeout: a device reported healthy turns Unknown
// when its report is older than the timeout (injected clock): its pods
// are told at that time, without another report (the driver reports once
// an hour and keeps its stream open); the device takes the driver's next
// report, and turns Unknown when the driver dies; the pods using it are
// told each time.
func TestHealthUnknownAfterTimeout(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	reports := make(chan string, 10)
	timers := make(chan time.Time, 100)
	n := newNodeHooked(t, "", func(c *Config) { c.Clock = clk }, func(m *Manager) {
		m.onHealthTimer = func(at time.Time) { timers <- at }
	})
	n.m.onHealth = func(driver string) { reports <- driver }
	d := n.startDriver(t, "--resend", "1h")
	n.waitPlugins(t, 1)
	<-reports
	reportedAt := clk.Now()
	expiry := reportedAt.Add(DefaultHealthTimeout).Add(time.Nanosecond)
	armed(t, timers, expiry)
	if h := n.m.DeviceHealth(driverName, "pool", "dev-0"); h.Health != Healthy {
		t.Fatalf("health %+v, want Healthy", h)
	}
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	pod := dratest.Pod("default", "p", "pod-1", "a")
	if err := n.m.PrepareResources(context.Background(), pod); err != nil {
		t.Fatal(err)
	}
	if m, _ := d.NextCall(t); m != "NodePrepareResources" {
		t.Fatalf("call %s", m)
	}

	clk.Step(DefaultHealthTimeout)
	if h := n.m.DeviceHealth(driverName, "pool", "dev-0"); h.Health != Healthy {
		t.Fatalf("health at the timeout %+v, want Healthy still", h)
	}
	select {
	case uids := <-n.m.Updates():
		t.Fatalf("update for %v at the timeout, want none before it passed", uids)
	default:
	}
	clk.Step(time.Nanosecond)
	select {
	case uids := <-n.m.Updates():
		if !reflect.DeepEqual(uids, []types.UID{"pod-1"}) {
			t.Fatalf("update for %v once the timeout passed, want pod-1", uids)
		}
	case <-time.After(time.Minute):
		t.Fatal("no update for pod-1 within a minute of the timeout passing: its device's health expired unnoticed")
	}
	if h := n.m.DeviceHealth(driverName, "pool", "dev-0"); h.Health != Unknown {
		t.Fatalf("health after the timeout %+v, want Unknown", h)
	}
	status := &corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main"}}}
	n.m.UpdateAllocatedResourcesStatus(pod, status)
	want := []corev1.ResourceStatus{{Name: "claim:a", Resources: []corev1.ResourceHealth{{ResourceID: "fake.dpkit.io/device=dev-0", Health: corev1.ResourceHealthStatusUnknown}}}}
	if got := status.ContainerStatuses[0].AllocatedResourcesStatus; !reflect.DeepEqual(got, want) {
		t.Fatalf("allocatedResourcesStatus = %+v, want %+v", got, want)
	}

	d.Send(t, "health dev-0 Unhealthy fan stopped")
	<-reports
	if uids := <-n.m.Updates(); !reflect.DeepEqual(uids, []types.UID{"pod-1"}) {
		t.Fatalf("update for %v, want pod-1", uids)
	}
	n.m.UpdateAllocatedResourcesStatus(pod, status)
	got := status.ContainerStatuses[0].AllocatedResourcesStatus[0].Resources[0]
	if got.Health != corev1.ResourceHealthStatusUnhealthy || got.Message == nil || *got.Message != "fan stopped" {
		t.Fatalf("resource health %+v, want Unhealthy with the driver's message", got)
	}

	d.Kill()
	if uids := <-n.m.Updates(); !reflect.DeepEqual(uids, []types.UID{"pod-1"}) {
		t.Fatalf("update for %v, want pod-1", uids)
	}
	if h := n.m.DeviceHealth(driverName, "pool", "dev-0"); h.Health != Unknown {
		t.Fatalf("health after the driver died %+v, want Unknown", h)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Root: "relative", CallTimeout: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "config.root") || !strings.Contains(err.Error(), "config.callTimeout") {
		t.Fatalf("err = %v, want both problems with their paths", err)
	}
}

func TestCorruptCheckpointRefused(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	if err := checkpoint.Write(filepath.Join(root, checkpoint.FileName), nil); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root, checkpoint.FileName)
	if err := writeFile(path, `{"Data":"{}","Checksum":1}`); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Root: root})
	if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "remove the file") {
		t.Fatalf("err = %v, want the file named with the fix", err)
	}
}

// TestNewWritesEmptyCheckpoint: on a root without a checkpoint, New writes
// the kubelet's empty one at once, byte for byte (what NewManager's
// GetOrCreate stores; test/e2e/dra_sidebyside_test.go compares them).
func TestNewWritesEmptyCheckpoint(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "kubelet")
	if _, err := New(Config{Root: root}); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, checkpoint.FileName))
	if err != nil {
		t.Fatal(err)
	}
	const kubelet = `{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":null}","Checksum":4010664294}`
	if string(got) != kubelet {
		t.Fatalf("checkpoint of a fresh root:\n%s\nwant the kubelet's\n%s", got, kubelet)
	}
}

// TestReconcileEveryPeriod: every ReconcilePeriod the manager unprepares
// the claims of the pods ActivePods no longer lists, as the kubelet's
// reconcile loop does, and keeps those of the pods it lists.
func TestReconcileEveryPeriod(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var mu sync.Mutex
	active := []*corev1.Pod{dratest.Pod("default", "p1", "pod-1", "a"), dratest.Pod("default", "p2", "pod-2", "b")}
	// onHealthTimer is called once the reconcile timer is armed.
	looping := make(chan struct{}, 1)
	n := newNodeHooked(t, "", func(c *Config) {
		c.Clock = clk
		c.ActivePods = func() []*corev1.Pod {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(active)
		}
	}, func(m *Manager) {
		m.onHealthTimer = func(time.Time) {
			select {
			case looping <- struct{}{}:
			default:
			}
		}
	})
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	n.claims.Add(t, "default", "b", "uid-b", []types.UID{"pod-2"}, "dev-1")
	ctx := context.Background()
	for _, p := range active {
		if err := n.m.PrepareResources(ctx, p); err != nil {
			t.Fatal(err)
		}
		if m, _ := d.NextCall(t); m != "NodePrepareResources" {
			t.Fatalf("call %s", m)
		}
	}
	mu.Lock()
	active = active[1:]
	mu.Unlock()
	<-looping
	clk.Step(DefaultReconcilePeriod)
	if m, uids := d.NextCall(t); m != "NodeUnprepareResources" || !reflect.DeepEqual(uids, []string{"uid-a"}) {
		t.Fatalf("call %s %v, want NodeUnprepareResources [uid-a]", m, uids)
	}
	d.NoMoreCalls(t)
}

// TestHealthUpdatesNeverDropped: health changes the caller has not read
// yet wait as one update, with every pod they concern: none is dropped,
// however many come (the kubelet's channel drops what passes 100).
func TestHealthUpdatesNeverDropped(t *testing.T) {
	m := &Manager{updates: make(chan []types.UID, 1), cache: claimCache{claims: map[string]*claimInfo{}}}
	const claims = 250
	var want []types.UID
	for i := range claims {
		dev := fmt.Sprintf("dev-%03d", i)
		pod := types.UID("pod-" + dev)
		want = append(want, pod)
		m.cache.claims[claimKey("default", dev)] = &claimInfo{ClaimState: checkpoint.ClaimState{
			PodUIDs:     checkpoint.PodSet{string(pod): {}},
			DriverState: map[string]checkpoint.DriverState{"d": {Devices: []checkpoint.Device{{PoolName: "pool", DeviceName: dev}}}},
		}}
	}
	for i := range claims {
		m.notify("d", []DeviceHealth{{PoolName: "pool", DeviceName: fmt.Sprintf("dev-%03d", i), Health: Unhealthy}})
	}
	m.notify("other", []DeviceHealth{{PoolName: "pool", DeviceName: "dev-000"}}) // no claim of its driver: nothing to send
	if got := <-m.Updates(); !reflect.DeepEqual(got, want) {
		t.Fatalf("%d pods in the update, want all %d in order", len(got), len(want))
	}
	select {
	case got := <-m.Updates():
		t.Fatalf("a second update %v, want one for all", got)
	default:
	}
}
