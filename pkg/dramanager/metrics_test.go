package dramanager

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
)

// TestMetrics: the kubelet's DRA metrics count what the manager does: a
// PrepareResources and an UnprepareResources (each a success), one that
// fails (a claim not reserved for the pod), the gRPC calls to the driver
// by full method name and status code, and the prepared claims in use by
// driver and across drivers, back to zero once unprepared. A second
// manager on the same registry is refused with an error that says why.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := clocktesting.NewFakeClock(time.Unix(1_800_000_000, 0))
	n := newNode(t, "", func(c *Config) { c.Registerer = reg; c.Clock = clk })
	d := n.startDriver(t)
	n.waitPlugins(t, 1)
	n.claims.Add(t, "default", "a", "uid-a", []types.UID{"pod-1"}, "dev-0")
	n.claims.Add(t, "default", "other", "uid-o", []types.UID{"pod-9"}, "dev-1")
	ctx := context.Background()
	pod := dratest.Pod("default", "p", "pod-1", "a")

	inUse := func(want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP dra_resource_claims_in_use `+claimsInUseHelp+`
# TYPE dra_resource_claims_in_use gauge
`+want), "dra_resource_claims_in_use"); err != nil {
			t.Fatal(err)
		}
	}
	inUse(`dra_resource_claims_in_use{driver_name="<any>"} 0
`)
	if err := n.m.PrepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	d.NextCall(t)
	inUse(`dra_resource_claims_in_use{driver_name="<any>"} 1
dra_resource_claims_in_use{driver_name="fake.dpkit.io"} 1
`)
	if err := n.m.PrepareResources(ctx, dratest.Pod("default", "q", "pod-2", "other")); err == nil {
		t.Fatal("a claim not reserved for the pod was prepared")
	}
	if err := n.m.UnprepareResources(ctx, pod); err != nil {
		t.Fatal(err)
	}
	d.NextCall(t)
	inUse(`dra_resource_claims_in_use{driver_name="<any>"} 0
`)

	for _, tc := range []struct {
		op, isError string
		want        uint64
	}{
		{"PrepareResources", "false", 1},
		{"PrepareResources", "true", 1},
		{"UnprepareResources", "false", 1},
		{"UnprepareResources", "true", 0},
	} {
		labels := map[string]string{"operation_name": tc.op, "is_error": tc.isError}
		if got := histCount(t, reg, "dra_operations_duration_seconds", labels); got != tc.want {
			t.Fatalf("dra_operations_duration_seconds%v count %d, want %d", labels, got, tc.want)
		}
	}
	for _, method := range []string{drav1.DRAPlugin_NodePrepareResources_FullMethodName, drav1.DRAPlugin_NodeUnprepareResources_FullMethodName} {
		labels := map[string]string{"driver_name": driverName, "method_name": method, "grpc_status_code": "OK"}
		if got := histCount(t, reg, "dra_grpc_operations_duration_seconds", labels); got != 1 {
			t.Fatalf("dra_grpc_operations_duration_seconds%v count %d, want 1", labels, got)
		}
	}

	if _, err := New(Config{Root: t.TempDir(), Registerer: reg}); err == nil || !strings.Contains(err.Error(), "give each manager its own") {
		t.Fatalf("second manager on one registry: err %v, want the duplicate named", err)
	}
}

// histCount returns the sample count of the histogram name with labels
// in reg, 0 when there is none.
func histCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}
