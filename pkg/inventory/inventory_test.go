package inventory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePlugin reports the snapshots sent on its channel; Allocate records
// its calls and fails when failAllocate is set.
type fakePlugin struct {
	snaps    chan []deviceplugin.Device
	mu       sync.Mutex
	calls    [][]string
	fail     error
	scanErrs chan error // when set, Scan returns the next error first
}

func newFake() *fakePlugin { return &fakePlugin{snaps: make(chan []deviceplugin.Device, 8)} }

func (p *fakePlugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	if p.scanErrs != nil {
		select {
		case err := <-p.scanErrs:
			return err
		default:
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case s := <-p.snaps:
			notify(s)
		}
	}
}

func (p *fakePlugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail != nil {
		return nil, p.fail
	}
	p.calls = append(p.calls, slices.Clone(ids))
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DEV": strings.Join(ids, ",")}}, nil
}

type preferring struct{ *fakePlugin }

func (preferring) PreferredAllocation(context.Context, deviceplugin.PreferredAllocationRequest) ([]string, error) {
	return []string{"pref"}, nil
}

type prestarting struct{ *fakePlugin }

func (prestarting) PreStartContainer(context.Context, []string) error {
	return errors.New("prestart called")
}

func devs(ids ...string) []deviceplugin.Device {
	out := make([]deviceplugin.Device, len(ids))
	for i, id := range ids {
		out[i] = deviceplugin.Device{ID: id, Healthy: true}
	}
	return out
}

// run starts inv.Run for the test and waits for the first snapshot.
func run(t *testing.T, inv *Inventory, p *fakePlugin, first []deviceplugin.Device) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	ch, stop := inv.Watch()
	defer stop()
	p.snaps <- first
	for {
		if _, known := inv.Devices(); known {
			return
		}
		<-ch
	}
}

func ids(ds []deviceplugin.Device) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.ID
	}
	return out
}

var claimA = ClaimHolder("default", "a", "uid-a")

func TestAcquireAllOrNothing(t *testing.T) {
	t.Parallel()
	inv := New("example.com/dev", newFake(), nil)
	if err := inv.Acquire([]string{"d0", "d1"}, claimA); err != nil {
		t.Fatal(err)
	}
	if err := inv.Acquire([]string{"d0", "d1"}, claimA); err != nil {
		t.Fatalf("same holder again: %v, want success", err)
	}
	claimB := ClaimHolder("default", "b", "uid-b")
	err := inv.Acquire([]string{"d2", "d1"}, claimB)
	var ce *ConflictError
	if !errors.As(err, &ce) || ce.Device != "d1" || ce.Holder != claimA || !errors.Is(err, ErrHeld) {
		t.Fatalf("err = %v, want a ConflictError for d1 held by claim a", err)
	}
	for _, want := range []string{`"d1"`, "ResourceClaim default/a (uid-a)", "dra front"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if h, held := inv.HeldBy("d2"); held {
		t.Fatalf("d2 held by %v after a refused Acquire; want all or nothing", h)
	}
	inv.Release(claimA)
	if _, held := inv.HeldBy("d0"); held {
		t.Fatal("d0 still held after Release")
	}
	if err := inv.Acquire([]string{"d2", "d1"}, claimB); err != nil {
		t.Fatal(err)
	}
}

// TestArbiterConcurrent: many holders race for overlapping devices; a
// device never has two holders at once. Run with -race.
func TestArbiterConcurrent(t *testing.T) {
	t.Parallel()
	inv := New("example.com/dev", newFake(), nil)
	const devices, workers, rounds = 8, 16, 200
	var (
		mu    sync.Mutex
		owner = map[string]int{} // who the test saw take each device
		wg    sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			h := Holder{Front: []Front{FrontDRA, FrontDevicePlugin}[w%2], Owner: fmt.Sprint("w", w)}
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				want := []string{fmt.Sprint("d", r.IntN(devices)), fmt.Sprint("d", r.IntN(devices))}
				if inv.Acquire(want, h) != nil {
					continue
				}
				mu.Lock()
				for _, id := range want {
					if o, ok := owner[id]; ok && o != w {
						t.Errorf("%s given to %d while %d holds it", id, w, o)
					}
					owner[id] = w
				}
				mu.Unlock()
				for _, id := range want {
					if got, _ := inv.HeldBy(id); got != h {
						t.Errorf("HeldBy(%s) = %v, want %v", id, got, h)
					}
				}
				mu.Lock()
				for _, id := range want {
					delete(owner, id)
				}
				mu.Unlock()
				inv.Release(h)
			}
		})
	}
	wg.Wait()
}

// TestDevicePluginFrontCapabilities: the front passes the real plugin's
// PreStartContainer through, and implements it only when the real plugin
// does; it always answers GetPreferredAllocation, with the real plugin's
// answer when it has one.
func TestDevicePluginFrontCapabilities(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                string
		p                   deviceplugin.Plugin
		preferred, prestart bool
	}{
		{"plain", newFake(), false, false},
		{"preferred", preferring{newFake()}, true, false},
		{"prestart", prestarting{newFake()}, false, true},
		{"both", struct {
			preferring
			deviceplugin.PreStarter
		}{preferring{newFake()}, prestarting{}}, true, true},
	} {
		f := New("example.com/dev", tc.p, nil).DevicePluginFront()
		pa, isPA := f.(deviceplugin.PreferredAllocator)
		ps, isPS := f.(deviceplugin.PreStarter)
		if !isPA || isPS != tc.prestart {
			t.Errorf("%s: front preferred=%v prestart=%v, want true %v", tc.name, isPA, isPS, tc.prestart)
			continue
		}
		want := []string{"d0"} // packed by NUMA node, in ID order
		if tc.preferred {
			want = []string{"pref"}
		}
		req := deviceplugin.PreferredAllocationRequest{Available: devs("d1", "d0"), Size: 1}
		if got, _ := pa.PreferredAllocation(context.Background(), req); !slices.Equal(got, want) {
			t.Errorf("%s: PreferredAllocation = %v, want %v", tc.name, got, want)
		}
		if isPS {
			if err := ps.PreStartContainer(context.Background(), nil); err == nil || err.Error() != "prestart called" {
				t.Errorf("%s: PreStartContainer = %v, not the real plugin's", tc.name, err)
			}
		}
	}
}

// asking is a plugin whose PreferredAllocation records what it was
// asked and prefers the first devices available.
type asking struct {
	*fakePlugin
	asked chan []string
}

func (a asking) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	a.asked <- ids(req.Available)
	return ids(req.Available)[:min(req.Size, len(req.Available))], nil
}

// TestPreferredAllocationSteers: a device a claim took since the kubelet
// last heard from Scan (the kubelet still lists it available) is left out
// of what the front prefers, and of what the real plugin is asked to
// choose from.
func TestPreferredAllocationSteers(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"no preference", "the plugin's preference"} {
		p := newFake()
		var plugin deviceplugin.Plugin = p
		var asked chan []string
		if name == "the plugin's preference" {
			asked = make(chan []string, 1)
			plugin = asking{p, asked}
		}
		inv := New("example.com/dev", plugin, nil)
		run(t, inv, p, devs("d0", "d1", "d2"))
		if err := inv.Acquire([]string{"d0"}, claimA); err != nil {
			t.Fatal(err)
		}
		pa := inv.DevicePluginFront().(deviceplugin.PreferredAllocator)
		got, err := pa.PreferredAllocation(context.Background(), deviceplugin.PreferredAllocationRequest{Available: devs("d0", "d1", "d2"), Size: 1})
		if err != nil || !slices.Equal(got, []string{"d1"}) {
			t.Errorf("%s: PreferredAllocation = %v, %v; want [d1], not the claimed d0", name, got, err)
		}
		if asked != nil {
			if a := <-asked; !slices.Equal(a, []string{"d1", "d2"}) {
				t.Errorf("%s: the plugin was asked to choose from %v, want [d1 d2]", name, a)
			}
		}
	}
}

// TestDevicePluginFront: the front withdraws claimed devices from Scan and
// refuses them in Allocate; what it allocates, claims cannot take.
func TestDevicePluginFront(t *testing.T) {
	t.Parallel()
	p := newFake()
	inv := New("example.com/dev", p, nil)
	run(t, inv, p, devs("d0", "d1", "d2"))
	f := inv.DevicePluginFront()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	views := make(chan []string, 16)
	scanDone := make(chan error, 1)
	go func() { scanDone <- f.Scan(ctx, func(d []deviceplugin.Device) { views <- ids(d) }) }()
	if got := <-views; !slices.Equal(got, []string{"d0", "d1", "d2"}) {
		t.Fatalf("first view %v", got)
	}
	if err := inv.Acquire([]string{"d1"}, claimA); err != nil {
		t.Fatal(err)
	}
	waitView(t, views, "d0", "d2") // d1 withdrawn

	_, err := f.Allocate(ctx, []string{"d0", "d1"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ResourceClaim default/a (uid-a)") {
		t.Fatalf("Allocate of a claimed device: %v, want FailedPrecondition naming the claim", err)
	}
	if _, held := inv.HeldBy("d0"); held || len(p.calls) != 0 {
		t.Fatal("a refused Allocate held d0 or reached the plugin")
	}

	resp, err := f.Allocate(ctx, []string{"d0"})
	if err != nil || resp.Envs["DEV"] != "d0" {
		t.Fatalf("Allocate(d0) = %v, %v", resp, err)
	}
	err = inv.Acquire([]string{"d0"}, ClaimHolder("default", "b", "uid-b"))
	if !errors.Is(err, ErrHeld) || !strings.Contains(err.Error(), "device plugin container through the deviceplugin front") {
		t.Fatalf("Acquire of an allocated device: %v, want refused naming the device plugin container", err)
	}

	p.mu.Lock()
	p.fail = errors.New("boom")
	p.mu.Unlock()
	if _, err := f.Allocate(ctx, []string{"d2"}); err == nil {
		t.Fatal("Allocate succeeded with a failing plugin")
	}
	if _, held := inv.HeldBy("d2"); held {
		t.Fatal("d2 held after the plugin's Allocate failed")
	}
	inv.Release(claimA)
	waitView(t, views, "d0", "d1", "d2") // d1 offered again
	cancel()
	if err := <-scanDone; err != nil {
		t.Fatal(err)
	}
}

// waitView reads views until one is want; the test's timeout catches a
// view that never comes.
func waitView(t *testing.T, views <-chan []string, want ...string) {
	t.Helper()
	for got := range views {
		if slices.Equal(got, want) {
			return
		}
		t.Logf("view %v, waiting for %v", got, want)
	}
}

// podResources is a PodResources server on a unix socket listing what the
// test sets.
type podResources struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	mu   sync.Mutex
	resp *podresourcesv1.ListPodResourcesResponse
}

func (s *podResources) List(context.Context, *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resp, nil
}

func (s *podResources) set(resource string, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resp = &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Name: "p", Namespace: "default",
		Containers: []*podresourcesv1.ContainerResources{{Name: "c", Devices: []*podresourcesv1.ContainerDevices{
			{ResourceName: resource, DeviceIds: ids},
			{ResourceName: "other.com/dev", DeviceIds: []string{"d9"}},
		}}},
	}}}
}

func servePodResources(t *testing.T) (*podResources, PodResourcesLister) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pr := &podResources{}
	pr.set("example.com/dev")
	podresourcesv1.RegisterPodResourcesListerServer(srv, pr)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	client, closer, err := prclient.New(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer.Close() })
	return pr, client
}

// TestRefreshFromPodResources: device plugin holds follow what the kubelet
// lists; an Allocate it never recorded is released after the grace.
func TestRefreshFromPodResources(t *testing.T) {
	t.Parallel()
	pr, client := servePodResources(t)
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	p := newFake()
	inv := New("example.com/dev", p, nil, WithClock(clk), WithPodResources(client), WithAllocateGrace(time.Minute))
	f := inv.DevicePluginFront()
	ctx := context.Background()
	dp := Holder{Front: FrontDevicePlugin, Owner: DevicePluginOwner}

	// A device allocated before this process started is held once listed.
	pr.set("example.com/dev", "d5")
	if err := inv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if h, _ := inv.HeldBy("d5"); h != dp {
		t.Fatalf("listed d5 held by %v, want the device plugin front", h)
	}
	if _, held := inv.HeldBy("d9"); held {
		t.Fatal("a device of another resource was held")
	}

	// d0: allocated and recorded; d1: allocated, never recorded.
	for _, id := range []string{"d0", "d1"} {
		if _, err := f.Allocate(ctx, []string{id}); err != nil {
			t.Fatal(err)
		}
	}
	pr.set("example.com/dev", "d0")
	if err := inv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := inv.Held(FrontDevicePlugin); !slices.Equal(got, []string{"d0", "d1"}) {
		t.Fatalf("held %v, want d0 (listed) and d1 (within the grace); d5 is no longer listed", got)
	}
	clk.Step(time.Minute)
	pr.set("example.com/dev")
	if err := inv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := inv.Held(FrontDevicePlugin); len(got) != 0 {
		t.Fatalf("held %v, want none: d0's container is gone and d1's grace has passed", got)
	}
}

// TestNoPodResourcesKeepsHolds: without PodResources, holds are never
// released.
func TestNoPodResourcesKeepsHolds(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	inv := New("example.com/dev", newFake(), nil, WithClock(clk))
	if _, err := inv.DevicePluginFront().Allocate(context.Background(), []string{"d0"}); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Hour)
	if err := inv.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, held := inv.HeldBy("d0"); !held {
		t.Fatal("d0 released without PodResources")
	}
}

// TestRunRetriesScan: a failing Scan is run again after the back-off.
func TestRunRetriesScan(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	p := newFake()
	p.scanErrs = make(chan error, 1)
	p.scanErrs <- errors.New("no sysfs yet")
	inv := New("example.com/dev", p, nil, WithClock(clk), WithRetry(time.Second, time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	for !clk.HasWaiters() {
		runtime.Gosched()
	}
	clk.Step(time.Second)
	ch, stop := inv.Watch()
	p.snaps <- devs("d0")
	for {
		if d, known := inv.Devices(); known {
			if !slices.Equal(ids(d), []string{"d0"}) {
				t.Fatalf("devices %v", d)
			}
			break
		}
		<-ch
	}
	stop()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// scriptedPodResources answers each List with the next error the test
// hands it (nil: an empty list), so the test knows when each call starts.
type scriptedPodResources chan error

func (s scriptedPodResources) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest, _ ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	select {
	case err := <-s:
		if err != nil {
			return nil, err
		}
		return &podresourcesv1.ListPodResourcesResponse{}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// logRecords keeps the level, message and attributes of every record.
type logRecords struct {
	mu      sync.Mutex
	records []string
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	s := r.Level.String()
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "fix" {
			s += " with a fix"
		}
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records = append(l.records, s)
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// TestPodResourcesDownLoggedOnce: a PodResources API that does not answer
// (no kubelet socket) is said once, at WARN with the fix, not on every
// refresh; its return is said once at INFO; a failure of another kind is
// said again.
func TestPodResourcesDownLoggedOnce(t *testing.T) {
	t.Parallel()
	// What the real client answers without a socket.
	client, closer, err := prclient.New(filepath.Join(t.TempDir(), "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	_, noSocket := client.List(context.Background(), &podresourcesv1.ListPodResourcesRequest{})
	_ = closer.Close()
	if status.Code(noSocket) != codes.Unavailable {
		t.Fatalf("List without a socket: %v, want Unavailable", noSocket)
	}
	denied := status.Error(codes.PermissionDenied, "permission denied")

	script := []struct {
		answer error
		want   string // what that refresh logs; "" nothing
	}{
		{noSocket, "WARN with a fix"},
		{noSocket, "DEBUG"},
		{noSocket, "DEBUG"},
		{nil, "INFO"},
		{nil, ""},
		{noSocket, "WARN with a fix"},
		{denied, "WARN with a fix"},
		{denied, "DEBUG"},
		{nil, "INFO"},
	}
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	answers := make(scriptedPodResources)
	logs := &logRecords{}
	inv := New("example.com/dev", newFake(), slog.New(logs), WithClock(clk), WithPodResources(answers), WithRefreshPeriod(10*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx) }()
	var want []string
	for i, s := range script {
		if i > 0 {
			clk.Step(10 * time.Second) // the ticker keeps a tick until the loop takes it
		}
		answers <- s.answer // the refresh's List has started
		if s.want != "" {
			want = append(want, s.want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := logs.records; !slices.Equal(got, want) {
		t.Errorf("logged %q over %d refreshes, want %q", got, len(script), want)
	}
}
