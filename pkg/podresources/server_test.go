package podresources

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type fakePods []*corev1.Pod

func (f fakePods) GetActivePods() []*corev1.Pod { return f }

func (f fakePods) GetPodByName(namespace, name string) (*corev1.Pod, bool) {
	for _, p := range f {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// fakeDevices maps "podUID/container" to devices.
type fakeDevices struct {
	byContainer map[string][]*podresourcesv1.ContainerDevices
	allocatable []*podresourcesv1.ContainerDevices
}

func (f *fakeDevices) GetDevices(podUID, container string) []*podresourcesv1.ContainerDevices {
	return f.byContainer[podUID+"/"+container]
}
func (f *fakeDevices) GetAllocatableDevices() []*podresourcesv1.ContainerDevices {
	return f.allocatable
}

type fakeCPUs struct{}

func (fakeCPUs) GetCPUs(podUID, container string) []int64 {
	if container == "main" {
		return []int64{2, 3}
	}
	return nil
}
func (fakeCPUs) GetAllocatableCPUs() []int64 { return []int64{0, 1, 2, 3} }

type fakeDRA struct{}

func (fakeDRA) GetDynamicResources(pod *corev1.Pod, c *corev1.Container) []*podresourcesv1.DynamicResource {
	return []*podresourcesv1.DynamicResource{{ClaimName: pod.Name + "-" + c.Name, ClaimNamespace: pod.Namespace}}
}

func numa(ids ...int64) *podresourcesv1.TopologyInfo {
	t := &podresourcesv1.TopologyInfo{}
	for _, id := range ids {
		t.Nodes = append(t.Nodes, &podresourcesv1.NUMANode{ID: id})
	}
	return t
}

func pod(ns, name, uid string, initContainers []corev1.Container, containers ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	p.Spec.InitContainers = initContainers
	for _, c := range containers {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c})
	}
	return p
}

var always = corev1.ContainerRestartPolicyAlways

func fixture() (fakePods, *fakeDevices) {
	pods := fakePods{
		pod("default", "trainer", "uid-1", []corev1.Container{
			{Name: "setup"},
			{Name: "sidecar", RestartPolicy: &always},
		}, "main", "helper"),
		pod("ml", "idle", "uid-2", nil, "main"),
	}
	devs := &fakeDevices{
		byContainer: map[string][]*podresourcesv1.ContainerDevices{
			"uid-1/main":    {{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu0", "gpu1"}, Topology: numa(0)}},
			"uid-1/sidecar": {{ResourceName: "example.com/nic", DeviceIds: []string{"nic3"}, Topology: numa(1)}},
			"uid-1/setup":   {{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu9"}}},
		},
		allocatable: []*podresourcesv1.ContainerDevices{
			{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu0", "gpu1"}, Topology: numa(0)},
			{ResourceName: "example.com/nic", DeviceIds: []string{"nic3"}, Topology: numa(1)},
		},
	}
	return pods, devs
}

// serve starts a Server for cfg on a socket in a fresh directory and
// returns a connected client.
func serve(t *testing.T, cfg Config) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	dir := testdir.Short(t, "pr")
	socket := SocketPath(dir)
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, socket) }()

	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer dcancel()
	var client podresourcesv1.PodResourcesListerClient
	var closer interface{ Close() error }
	// The socket appears once Serve listens; Dial retries until then.
	client, closer, err = prclient.Dial(dctx, socket)
	if err != nil {
		cancel()
		if serr := <-done; serr != nil {
			t.Error(serr)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = closer.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket left behind after Serve returned: %v", err)
		}
	})
	return client
}

func TestList(t *testing.T) {
	t.Parallel()
	pods, devs := fixture()
	tests := []struct {
		name string
		cfg  Config
		want *podresourcesv1.ListPodResourcesResponse
	}{
		{
			name: "devices only",
			cfg:  Config{Providers: Providers{Pods: pods, Devices: devs}},
			want: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
				{Name: "trainer", Namespace: "default", Containers: []*podresourcesv1.ContainerResources{
					{Name: "sidecar", Devices: devs.byContainer["uid-1/sidecar"]},
					{Name: "main", Devices: devs.byContainer["uid-1/main"]},
					{Name: "helper"},
				}},
				{Name: "idle", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{{Name: "main"}}},
			}},
		},
		{
			name: "every provider",
			cfg:  Config{Providers: Providers{Pods: pods[1:], Devices: devs, CPUs: fakeCPUs{}, DynamicResources: fakeDRA{}}},
			want: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
				{Name: "idle", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{{
					Name: "main", CpuIds: []int64{2, 3},
					DynamicResources: []*podresourcesv1.DynamicResource{{ClaimName: "idle-main", ClaimNamespace: "ml"}},
				}}},
			}},
		},
		{
			name: "no pods",
			cfg:  Config{Providers: Providers{Pods: fakePods{}}},
			want: &podresourcesv1.ListPodResourcesResponse{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := serve(t, tc.cfg)
			got, err := c.List(context.Background(), &podresourcesv1.ListPodResourcesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Errorf("List() =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

func TestGet(t *testing.T) {
	t.Parallel()
	pods, devs := fixture()
	c := serve(t, Config{Providers: Providers{Pods: pods, Devices: devs}})
	tests := []struct {
		name      string
		ns, pod   string
		want      *podresourcesv1.PodResources
		wantCode  codes.Code
		wantError string
	}{
		{
			name: "known pod", ns: "default", pod: "trainer",
			want: &podresourcesv1.PodResources{Name: "trainer", Namespace: "default", Containers: []*podresourcesv1.ContainerResources{
				{Name: "sidecar", Devices: devs.byContainer["uid-1/sidecar"]},
				{Name: "main", Devices: devs.byContainer["uid-1/main"]},
				{Name: "helper"},
			}},
		},
		{name: "unknown pod", ns: "default", pod: "nope", wantCode: codes.NotFound, wantError: "pod nope in namespace default not found"},
		{name: "right name, wrong namespace", ns: "ml", pod: "trainer", wantCode: codes.NotFound, wantError: "pod trainer in namespace ml not found"},
		{name: "empty request", wantCode: codes.NotFound, wantError: "pod  in namespace  not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := c.Get(context.Background(), &podresourcesv1.GetPodResourcesRequest{PodNamespace: tc.ns, PodName: tc.pod})
			if tc.wantError != "" {
				st, _ := status.FromError(err)
				if st.Code() != tc.wantCode || st.Message() != tc.wantError {
					t.Fatalf("Get() error = %v, want %v %q", err, tc.wantCode, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got.GetPodResources(), tc.want) {
				t.Errorf("Get() =\n%v\nwant\n%v", got.GetPodResources(), tc.want)
			}
		})
	}
}

func TestGetAllocatableResources(t *testing.T) {
	t.Parallel()
	pods, devs := fixture()
	tests := []struct {
		name string
		p    Providers
		want *podresourcesv1.AllocatableResourcesResponse
	}{
		{"devices and cpus", Providers{Pods: pods, Devices: devs, CPUs: fakeCPUs{}},
			&podresourcesv1.AllocatableResourcesResponse{Devices: devs.allocatable, CpuIds: []int64{0, 1, 2, 3}}},
		{"nothing", Providers{Pods: pods}, &podresourcesv1.AllocatableResourcesResponse{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := serve(t, Config{Providers: tc.p})
			got, err := c.GetAllocatableResources(context.Background(), &podresourcesv1.AllocatableResourcesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Errorf("GetAllocatableResources() =\n%v\nwant\n%v", got, tc.want)
			}
		})
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	pods, _ := fixture()
	// A bucket refilled once every 1000s: exactly the burst passes.
	const burst = 4
	c := serve(t, Config{Providers: Providers{Pods: pods}, QPS: 0.001, Burst: burst})
	ctx := context.Background()
	calls := []func() error{
		func() error { _, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); return err },
		func() error {
			_, err := c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
			return err
		},
		func() error {
			_, err := c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "idle"})
			return err
		},
	}
	for i := range burst {
		if err := calls[i%len(calls)](); err != nil {
			t.Fatalf("call %d within the burst: %v", i+1, err)
		}
	}
	for i, call := range calls {
		err := call()
		st, _ := status.FromError(err)
		if st.Code() != codes.ResourceExhausted || st.Message() != "rejected by rate limit" {
			t.Errorf("call %d past the burst: error %v, want ResourceExhausted \"rejected by rate limit\"", burst+i+1, err)
		}
	}
}

func TestRateLimitDisabled(t *testing.T) {
	t.Parallel()
	pods, _ := fixture()
	c := serve(t, Config{Providers: Providers{Pods: pods}, QPS: -1})
	for i := range 3 * DefaultBurstTokens {
		if _, err := c.List(context.Background(), &podresourcesv1.ListPodResourcesRequest{}); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
	}
}

type countingLimiter struct{ left int }

func (l *countingLimiter) Allow() bool { l.left--; return l.left >= 0 }

func TestLimiterUnaryServerInterceptor(t *testing.T) {
	t.Parallel()
	icpt := LimiterUnaryServerInterceptor(&countingLimiter{left: 2})
	handled := 0
	h := func(context.Context, any) (any, error) { handled++; return "ok", nil }
	for i, wantErr := range []error{nil, nil, ErrLimitExceeded, ErrLimitExceeded} {
		_, err := icpt(context.Background(), nil, nil, h)
		if !errors.Is(err, wantErr) {
			t.Errorf("call %d: %v, want %v", i+1, err, wantErr)
		}
	}
	if handled != 2 {
		t.Errorf("handler ran %d times, want 2", handled)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	s, err := NewServer(Config{Providers: Providers{Pods: fakePods{}}})
	if err != nil {
		t.Fatal(err)
	}
	if s.qps != 100 || s.burst != 10 {
		t.Errorf("rate limit = %v qps, burst %d; want the kubelet's 100 and 10", s.qps, s.burst)
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"valid", Config{Providers: Providers{Pods: fakePods{}}}, nil},
		{"no pods, negative burst", Config{Burst: -1}, []string{"providers.pods: Required value", "burst: Invalid value"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewServer(tc.cfg)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatalf("NewServer accepted %+v", tc.cfg)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestServeSocketHandling(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "pr")
	s, err := NewServer(Config{Providers: Providers{Pods: fakePods{}}})
	if err != nil {
		t.Fatal(err)
	}

	// A regular file is never replaced.
	regular := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(regular, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background(), regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Serve on a regular file = %v, want a not-a-socket error", err)
	}
	if b, _ := os.ReadFile(regular); string(b) != "keep" {
		t.Error("regular file was changed")
	}

	// A stale socket is replaced.
	stale := filepath.Join(dir, "sub", "stale.sock")
	if err := os.MkdirAll(filepath.Dir(stale), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, stale) }()
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer dcancel()
	c, closer, err := prclient.Dial(dctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(dctx, &podresourcesv1.ListPodResourcesRequest{}); err != nil {
		t.Errorf("List over the replaced socket: %v", err)
	}
	_ = closer.Close()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

func BenchmarkList(b *testing.B) {
	var pods fakePods
	devs := &fakeDevices{byContainer: map[string][]*podresourcesv1.ContainerDevices{}}
	for i := range 100 {
		uid := fmt.Sprintf("uid-%d", i)
		pods = append(pods, pod("default", fmt.Sprintf("p%d", i), uid, nil, "main", "side"))
		devs.byContainer[uid+"/main"] = []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: []string{fmt.Sprintf("gpu%d", i)}, Topology: numa(0)}}
	}
	s, err := NewServer(Config{Providers: Providers{Pods: pods, Devices: devs}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); err != nil {
			b.Fatal(err)
		}
	}
}

// brokenListener fails every Accept, as a listener whose socket was
// closed under it.
type brokenListener struct{ net.Listener }

func (brokenListener) Accept() (net.Conn, error) {
	return nil, errors.New("accept: the socket is gone")
}

// TestServeListenerFails: serving that fails before its context ends
// returns the failure, naming the address, without waiting for the
// context; a context that ends first stops it cleanly.
func TestServeListenerFails(t *testing.T) {
	t.Parallel()
	s, err := NewServer(Config{Providers: Providers{Pods: fakePods{}}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(testdir.Short(t, "pr"), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	err = s.ServeListener(context.Background(), brokenListener{l})
	if err == nil || !strings.Contains(err.Error(), "podresources: serving on") || !strings.Contains(err.Error(), "the socket is gone") {
		t.Fatalf("ServeListener on a failing listener: %v", err)
	}

	l2, err := net.Listen("unix", filepath.Join(testdir.Short(t, "pr"), "s.sock"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.ServeListener(ctx, l2); err != nil {
		t.Fatalf("ServeListener with its context already ended: %v", err)
	}
}
