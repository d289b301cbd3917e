package inventory

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/resourcename"
)

// fedPodResources answers each List with the next answer the test feeds
// it, so that the test says what the kubelet lists, and when.
type fedPodResources chan fedAnswer

type fedAnswer struct {
	resp *podresourcesv1.ListPodResourcesResponse
	err  error
}

func (f fedPodResources) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest, _ ...grpc.CallOption) (*podresourcesv1.ListPodResourcesResponse, error) {
	select {
	case a := <-f:
		return a.resp, a.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// claimed is a PodResources answer: one pod whose container holds, for
// each driver/device pair, a claim named after the device.
func claimed(pairs ...string) fedAnswer {
	c := &podresourcesv1.ContainerResources{Name: "c"}
	for i := 0; i+1 < len(pairs); i += 2 {
		c.DynamicResources = append(c.DynamicResources, &podresourcesv1.DynamicResource{
			ClaimName: "claim-" + pairs[i+1], ClaimNamespace: "default",
			ClaimResources: []*podresourcesv1.ClaimResource{{DriverName: pairs[i], PoolName: "node-1", DeviceName: resourcename.DRADeviceName(pairs[i+1])}},
		})
	}
	// A device plugin device of the same resource is no claim.
	c.Devices = []*podresourcesv1.ContainerDevices{{ResourceName: "example.com/gpu", DeviceIds: []string{"gpu-0-1g-6"}}}
	return fedAnswer{resp: &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Name: "p", Namespace: "default", Containers: []*podresourcesv1.ContainerResources{c},
	}}}}
}

// scanGuard runs the guard's Scan for the test and returns its views.
func scanGuard(t *testing.T, g deviceplugin.Plugin) <-chan []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	views := make(chan []string, 64)
	done := make(chan error, 1)
	go func() { done <- g.Scan(ctx, func(d []deviceplugin.Device) { views <- ids(d) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Scan: %v", err)
		}
	})
	return views
}

const guardDriver = "gpu.example.com"

// TestDevicePluginOnlyBesideDRA: served through the device plugin API
// alone beside claims of its driver, a resource never offers what they
// hold, as PodResources lists it: a claimed partition, the replicas of
// the GPU whose counters it takes, every replica of a GPU shared through
// DRA; and offers them again once no container lists them. Its first
// report waits for PodResources' first answer.
func TestDevicePluginOnlyBesideDRA(t *testing.T) {
	t.Parallel()
	p := gpuPlugin{newFake()}
	pr := make(fedPodResources)
	g := DevicePluginOnlyBesideDRA(p, guardDriver, pr, nil, WithRefreshPeriod(time.Millisecond), WithRetry(time.Millisecond, time.Millisecond), WithFirstAnswerWait(time.Hour))
	views := scanGuard(t, g)
	p.snaps <- p.devices()
	allDP := slices.Concat([]string{"gpu-0-3g-0"}, numbered("gpu-0-1g-", 7), numbered("gpu-0-r", 4))

	// The kubelet does not answer at first; the view waits for it.
	pr <- fedAnswer{err: status.Error(codes.Unavailable, "kubelet restarting")}
	pr <- fedAnswer{err: status.Error(codes.Unavailable, "kubelet restarting")}
	// A claim of the driver holds partition 1g-0; one of another driver
	// names the whole GPU, which is not this resource's claim.
	pr <- claimed(guardDriver, "gpu-0-1g-0", "other.example.com", "gpu-0")
	want := slices.Concat([]string{"gpu-0-3g-0"}, numbered("gpu-0-1g-", 7)[1:])
	if got := <-views; !slices.Equal(got, want) {
		t.Fatalf("first view %v, want %v: not the claimed partition, nor the replicas of the whole GPU it takes counters from", got, want)
	}
	_, err := g.Allocate(context.Background(), []string{"gpu-0-r0"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ResourceClaim default/claim-gpu-0-1g-0") {
		t.Fatalf("Allocate of a withheld replica: %v, want FailedPrecondition naming the claim", err)
	}

	// A claim of the driver shares the whole GPU: nothing is left.
	pr <- claimed(guardDriver, "gpu-0")
	waitView(t, views)

	// Its pod is gone: everything is offered again.
	pr <- claimed()
	waitView(t, views, allDP...)
	if _, err := g.Allocate(context.Background(), []string{"gpu-0-r0"}); err != nil {
		t.Fatalf("Allocate once no claim holds the GPU: %v", err)
	}
	// A claim on the 3g partition leaves every 1g one (each fits beside
	// it) and no replica (the whole GPU does not).
	pr <- fedAnswer{err: status.Error(codes.Unavailable, "kubelet restarting")}
	pr <- claimed(guardDriver, "gpu-0-3g-0")
	waitView(t, views, numbered("gpu-0-1g-", 7)...)
}

// TestDevicePluginOnlyBesideDRAWithoutKubelet: with no PodResources to
// ask, every device is offered at once; claims it lists later are
// followed.
func TestDevicePluginOnlyBesideDRAWithoutKubelet(t *testing.T) {
	t.Parallel()
	p := newFake()
	pr := make(fedPodResources)
	g := DevicePluginOnlyBesideDRA(p, guardDriver, pr, nil, WithRefreshPeriod(time.Millisecond), WithFirstAnswerWait(0))
	views := scanGuard(t, g)
	p.snaps <- devs("d0", "d1")
	pr <- fedAnswer{err: status.Error(codes.Unavailable, "no such file or directory")}
	if got := <-views; !slices.Equal(got, []string{"d0", "d1"}) {
		t.Fatalf("first view %v, want every device", got)
	}
	pr <- claimed(guardDriver, "d1")
	waitView(t, views, "d0")
}
