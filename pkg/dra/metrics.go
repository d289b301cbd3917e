package dra

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	operations     *prometheus.CounterVec
	prepared       prometheus.Gauge
	specsRewritten prometheus.Counter
	relistens      prometheus.Counter
	publishes      *prometheus.CounterVec
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
		relistens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dpkit_dra_driver_socket_relistens_total", Help: "Sockets served again after their file was removed.", ConstLabels: labels,
		}),
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dpkit_dra_driver_slice_publishes_total", Help: "ResourceSlice publications, by result.", ConstLabels: labels,
		}, []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.operations, m.prepared, m.specsRewritten, m.relistens, m.publishes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("DRA driver %s metrics: %w (one Registerer per driver)", driver, err)
		}
	}
	return m, nil
}
