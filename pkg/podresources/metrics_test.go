package podresources

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pods, devs := fixture()
	s, err := NewServer(Config{Providers: Providers{Pods: pods, Devices: devs}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if _, err := s.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "idle"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "gone"}); err == nil {
		t.Fatal("Get of an unknown pod succeeded")
	}
	want := `
# HELP kubelet_pod_resources_endpoint_errors_get Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version.
# TYPE kubelet_pod_resources_endpoint_errors_get counter
kubelet_pod_resources_endpoint_errors_get{server_api_version="v1"} 1
# HELP kubelet_pod_resources_endpoint_requests_get Number of requests to the PodResource Get endpoint. Broken down by server api version.
# TYPE kubelet_pod_resources_endpoint_requests_get counter
kubelet_pod_resources_endpoint_requests_get{server_api_version="v1"} 2
# HELP kubelet_pod_resources_endpoint_requests_get_allocatable Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version.
# TYPE kubelet_pod_resources_endpoint_requests_get_allocatable counter
kubelet_pod_resources_endpoint_requests_get_allocatable{server_api_version="v1"} 1
# HELP kubelet_pod_resources_endpoint_requests_list Number of requests to the PodResource List endpoint. Broken down by server api version.
# TYPE kubelet_pod_resources_endpoint_requests_list counter
kubelet_pod_resources_endpoint_requests_list{server_api_version="v1"} 2
# HELP kubelet_pod_resources_endpoint_requests_total Cumulative number of requests to the PodResource endpoint. Broken down by server api version.
# TYPE kubelet_pod_resources_endpoint_requests_total counter
kubelet_pod_resources_endpoint_requests_total{server_api_version="v1"} 5
`
	names := []string{
		"kubelet_pod_resources_endpoint_errors_get", "kubelet_pod_resources_endpoint_requests_get",
		"kubelet_pod_resources_endpoint_requests_get_allocatable", "kubelet_pod_resources_endpoint_requests_list",
		"kubelet_pod_resources_endpoint_requests_total",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}

	// A second server on the same registry is refused, not silently merged.
	if _, err := NewServer(Config{Providers: Providers{Pods: pods}, Registerer: reg}); err == nil {
		t.Error("registering the metrics twice succeeded")
	}
}

// TestUnregisteredMetricsShared: servers without a registry share one
// set of counters, which nothing reads; each registry gets its own.
func TestUnregisteredMetricsShared(t *testing.T) {
	a, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Error("two servers without a registry hold counters of their own")
	}
	r, err := newMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if r == a {
		t.Error("a server with a registry counts in the shared counters")
	}
}
