package draplugin

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	operations     *prometheus.CounterVec
	prepared       prometheus.Gauge
	specsRewritten prometheus.Counter
	publishes      prometheus.Counter
	background     *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, driver string) (*metrics, error) {
	labels := prometheus.Labels{"driver": driver}
	m := &metrics{
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dpkit_dra_driver_operations_total", Help: "NodePrepareResources and NodeUnprepareResources claims, by operation and result.",
			ConstLabels: labels,
		}, []string{"operation", "result"}),
		prepared: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "dpkit_dra_driver_prepared_claims", Help: "Claims the driver holds prepared.", ConstLabels: labels,
		}),
		specsRewritten: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dpkit_dra_driver_cdi_specs_rewritten_total", Help: "CDI specs of prepared claims found gone and written again.", ConstLabels: labels,
		}),
		publishes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dpkit_dra_driver_slice_publishes_total", Help: "Device lists handed to the ResourceSlice controller (one per change).", ConstLabels: labels,
		}),
		background: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dpkit_dra_driver_background_errors_total", Help: "Errors the DRA helper reported in the background, by kind (dropped_fields, recoverable, fatal).", ConstLabels: labels,
		}, []string{"kind"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.operations, m.prepared, m.specsRewritten, m.publishes, m.background} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("DRA driver %s metrics: %w (one Registerer per driver)", driver, err)
		}
	}
	return m, nil
}
