package deviceplugin

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the server's Prometheus metrics. Every method is safe on a
// nil *metrics, so a server without a Registerer pays nothing.
type metrics struct {
	devices         *prometheus.GaugeVec
	registered      *prometheus.GaugeVec
	registrations   *prometheus.CounterVec
	reregistrations *prometheus.CounterVec
	allocations     *prometheus.CounterVec
	allocLatency    *prometheus.HistogramVec
	streams         *prometheus.GaugeVec
	messageBytes    *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	const ns = "dpkit_plugin"
	m := &metrics{
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "devices",
			Help: "Devices the plugin reports, by resource and health.",
		}, []string{"resource", "health"}),
		registered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "registered",
			Help: "1 while the resource is registered with the kubelet, 0 otherwise.",
		}, []string{"resource"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "registrations_total",
			Help: "Registration attempts with the kubelet, by result.",
		}, []string{"resource", "result"}),
		reregistrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "reregistrations_total",
			Help: "Re-registrations after the first, by what triggered them.",
		}, []string{"resource", "reason"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "allocate_requests_total",
			Help: "Allocate calls, by gRPC status code.",
		}, []string{"resource", "code"}),
		allocLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "allocate_duration_seconds",
			Help:    "Time spent answering Allocate.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"resource"}),
		streams: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "list_and_watch_streams",
			Help: "Open ListAndWatch streams.",
		}, []string{"resource"}),
		messageBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "list_and_watch_message_bytes",
			Help: "Encoded size of the last ListAndWatch message (the kubelet accepts at most 4 MiB).",
		}, []string{"resource"}),
	}
	for _, c := range []prometheus.Collector{m.devices, m.registered, m.registrations, m.reregistrations,
		m.allocations, m.allocLatency, m.streams, m.messageBytes} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) setDevices(resource string, healthy, unhealthy int) {
	if m == nil {
		return
	}
	m.devices.WithLabelValues(resource, "healthy").Set(float64(healthy))
	m.devices.WithLabelValues(resource, "unhealthy").Set(float64(unhealthy))
}

func (m *metrics) setRegistered(resource string, ok bool) {
	if m == nil {
		return
	}
	v := 0.0
	if ok {
		v = 1
	}
	m.registered.WithLabelValues(resource).Set(v)
}

func (m *metrics) registration(resource string, err error) {
	if m == nil {
		return
	}
	result := "success"
	if err != nil {
		result = "failure"
	}
	m.registrations.WithLabelValues(resource, result).Inc()
}

func (m *metrics) reregistration(resource, reason string) {
	if m == nil {
		return
	}
	m.reregistrations.WithLabelValues(resource, reason).Inc()
}

func (m *metrics) allocate(resource, code string, seconds float64) {
	if m == nil {
		return
	}
	m.allocations.WithLabelValues(resource, code).Inc()
	m.allocLatency.WithLabelValues(resource).Observe(seconds)
}

func (m *metrics) streamDelta(resource string, d float64) {
	if m == nil {
		return
	}
	m.streams.WithLabelValues(resource).Add(d)
}

func (m *metrics) setMessageBytes(resource string, n int) {
	if m == nil {
		return
	}
	m.messageBytes.WithLabelValues(resource).Set(float64(n))
}
