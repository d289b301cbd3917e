package podresources

import (
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kubelet's PodResources counters, with the same names
// and the label server_api_version="v1".
type metrics struct {
	requestsTotal, requestsList, requestsGetAllocatable, requestsGet prometheus.Counter
	errorsList, errorsGetAllocatable, errorsGet                      prometheus.Counter
}

// newMetrics returns the counters, registered with reg. Without a
// registry nothing can read them: every such server shares one set
// rather than holding seven counters of its own (a thousand nodes in
// one process have no registry each).
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return unregistered(), nil
	}
	m := buildMetrics()
	var errs []error
	for _, col := range []prometheus.Collector{m.requestsTotal, m.requestsList, m.requestsGetAllocatable, m.requestsGet, m.errorsList, m.errorsGetAllocatable, m.errorsGet} {
		if err := reg.Register(col); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("podresources: registering metrics: %w", err)
	}
	return m, nil
}

var unregistered = sync.OnceValue(buildMetrics)

func buildMetrics() *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{
			Namespace:   "kubelet",
			Name:        name,
			Help:        help + " Broken down by server api version.",
			ConstLabels: prometheus.Labels{"server_api_version": "v1"},
		})
	}
	return &metrics{
		requestsTotal:          c("pod_resources_endpoint_requests_total", "Cumulative number of requests to the PodResource endpoint."),
		requestsList:           c("pod_resources_endpoint_requests_list", "Number of requests to the PodResource List endpoint."),
		requestsGetAllocatable: c("pod_resources_endpoint_requests_get_allocatable", "Number of requests to the PodResource GetAllocatableResources endpoint."),
		requestsGet:            c("pod_resources_endpoint_requests_get", "Number of requests to the PodResource Get endpoint."),
		errorsList:             c("pod_resources_endpoint_errors_list", "Number of requests to the PodResource List endpoint which returned error."),
		errorsGetAllocatable:   c("pod_resources_endpoint_errors_get_allocatable", "Number of requests to the PodResource GetAllocatableResources endpoint which returned error."),
		errorsGet:              c("pod_resources_endpoint_errors_get", "Number of requests to the PodResource Get endpoint which returned error."),
	}
}
