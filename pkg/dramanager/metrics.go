package dramanager

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// ResourceClaimsInUseAnyDriver is the driver_name of
// dra_resource_claims_in_use that counts every claim in use, whatever its
// drivers (the kubelet's).
const ResourceClaimsInUseAnyDriver = "<any>"

// durationBuckets are the kubelet's DRADurationBuckets:
// ExponentialBucketsRange(0.1, 40, 15).
var durationBuckets = prometheus.ExponentialBucketsRange(.1, 40, 15)

// metrics are the kubelet's DRA manager metrics, with the same names,
// help, labels and buckets: dra_operations_duration_seconds,
// dra_grpc_operations_duration_seconds and dra_resource_claims_in_use.
// (dra_node_prepare_skips_total and dra_node_unprepare_skips_total count
// claims whose results skip node operations, which the manager refuses,
// so they are not exported.)
type metrics struct {
	operations *prometheus.HistogramVec
	grpc       *prometheus.HistogramVec
}

const claimsInUseHelp = "The number of ResourceClaims that are currently in use on the node, by driver name (driver_name label value) and across all drivers (special value <any> for driver_name). " +
	"Note that the sum of all by-driver counts is not the total number of in-use ResourceClaims because the same ResourceClaim might use devices from different drivers. " +
	"Instead, use the count for the <any> driver_name."

var claimsInUseDesc = prometheus.NewDesc("dra_resource_claims_in_use", claimsInUseHelp, []string{"driver_name"}, nil)

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	if reg == nil {
		return unregistered(), nil
	}
	mt := buildMetrics()
	var errs []error
	for _, c := range []prometheus.Collector{mt.operations, mt.grpc, claimsInUse{m}} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("registering metrics (a registry takes one DRA manager's; give each manager its own): %w", err)
	}
	return mt, nil
}

// unregistered is the histograms of every manager without a registry:
// nothing reads them, so they share one set rather than each holding
// its own.
var unregistered = sync.OnceValue(buildMetrics)

func buildMetrics() *metrics {
	return &metrics{
		operations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "dra",
			Name:      "operations_duration_seconds",
			Help: "Latency histogram in seconds for the duration of handling all ResourceClaims referenced by a pod when the pod starts or stops. " +
				"Identified by the name of the operation (PrepareResources or UnprepareResources) and separated by the success of the operation. " +
				"The number of failed operations is provided through the histogram's overall count.",
			Buckets: durationBuckets,
		}, []string{"operation_name", "is_error"}),
		grpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "dra",
			Name:      "grpc_operations_duration_seconds",
			Help:      "Duration in seconds of the DRA gRPC operations",
			Buckets:   durationBuckets,
		}, []string{"driver_name", "method_name", "grpc_status_code"}),
	}
}

// observeOperation records one PrepareResources or UnprepareResources.
func (mt *metrics) observeOperation(op string, start time.Time, now time.Time, err error) {
	mt.operations.WithLabelValues(op, strconv.FormatBool(err != nil)).Observe(now.Sub(start).Seconds())
}

// interceptor records every unary call to driver's plugin (the kubelet's
// newMetricsInterceptor): the full gRPC method name and status code.
func (mt *metrics) interceptor(m *Manager, driver string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := m.cfg.Clock.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		mt.grpc.WithLabelValues(driver, method, status.Code(err).String()).Observe(m.cfg.Clock.Since(start).Seconds())
		return err
	}
}

// claimsInUse collects dra_resource_claims_in_use when scraped: the
// prepared claims by driver, and all of them under
// ResourceClaimsInUseAnyDriver. Claims restored from the checkpoint count
// once prepared again, as the kubelet's; a driver without claims is not
// listed.
type claimsInUse struct{ m *Manager }

func (c claimsInUse) Describe(ch chan<- *prometheus.Desc) { ch <- claimsInUseDesc }

func (c claimsInUse) Collect(ch chan<- prometheus.Metric) {
	for driver, n := range c.m.ClaimsInUse() {
		ch <- prometheus.MustNewConstMetric(claimsInUseDesc, prometheus.GaugeValue, float64(n), driver)
	}
}

// ClaimsInUse returns the number of prepared claims by driver, and of all
// prepared claims under ResourceClaimsInUseAnyDriver: what
// dra_resource_claims_in_use reports.
func (m *Manager) ClaimsInUse() map[string]int {
	m.cache.mu.RLock()
	defer m.cache.mu.RUnlock()
	counts := map[string]int{}
	total := 0
	for _, ci := range m.cache.claims {
		if !ci.prepared {
			continue
		}
		total++
		for driver := range ci.DriverState {
			counts[driver]++
		}
	}
	counts[ResourceClaimsInUseAnyDriver] = total
	return counts
}
