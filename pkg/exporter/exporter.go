// Package exporter maps the devices a kubelet gave out to the pods that
// hold them, as Prometheus metrics: every device of a device plugin
// (namespace, pod, container, resource, device ID, NUMA node) and every
// DRA device (claim, driver, pool, device) the PodResources API lists, the
// allocatable and allocated count of each resource, each device's health
// where a HealthSource tells it, and readings (utilisation, memory, power,
// temperature) from DeviceCollectors such as AMD's sysfs one.
//
// It reads PodResources at most once per Config.CacheTTL, however many
// scrapers ask (the kubelet rejects more than 100 requests a second with a
// burst of 10, for all its clients together), and reconnects by itself
// when the kubelet's socket is served again after a restart.
//
// It imports no Kubernetes API types: what comes from the API server (pod
// labels, the device health of pod status) reaches it through PodSource.
package exporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/clock"
)

// DefaultCacheTTL is how long one PodResources answer serves scrapes.
const DefaultCacheTTL = 2 * time.Second

// DefaultTimeout bounds one PodResources call.
const DefaultTimeout = 5 * time.Second

// Health values of a device, as the pod status's allocatedResourcesStatus
// spells them.
const (
	Healthy   = "Healthy"
	Unhealthy = "Unhealthy"
	Unknown   = "Unknown"
)

// Device is one allocated (or, for device plugins, allocatable) device.
type Device struct {
	// Namespace, Pod and Container hold the device; empty for a device
	// no pod holds.
	Namespace, Pod, Container string
	// Resource is the extended resource of a device plugin's device;
	// empty for DRA.
	Resource string
	// ClaimNamespace, Claim, Driver, Pool and Name identify a DRA device;
	// empty for a device plugin's.
	ClaimNamespace, Claim, Driver, Pool, Name string
	// ID is the device plugin's device ID, or driver/pool/device for DRA.
	ID string
	// Share is the DRA share of a shared device the claim holds (its
	// shareID); empty for a device held whole.
	Share string
	// CDIDevices are the DRA device's fully qualified CDI device names.
	CDIDevices []string
	// NUMANodes the device is on, as PodResources reports them.
	NUMANodes []int64
}

// DRA reports whether d is a DRA device.
func (d Device) DRA() bool { return d.Driver != "" }

// PodKey names a pod.
type PodKey struct{ Namespace, Name string }

// PodInfo is what the API server says about a pod.
type PodInfo struct {
	// Labels are the pod's labels.
	Labels map[string]string
	// Health is the device health of the pod's status
	// (allocatedResourcesStatus of its containers and init containers):
	// container -> resource -> resource ID -> Healthy, Unhealthy or
	// Unknown. DRA devices are under "claim:<name>" or
	// "claim:<name>/<request>" (name: the container's reference to the
	// claim, pod.spec.resourceClaims[].name, not the ResourceClaim's
	// name), by their first CDI device name or by
	// <driver>/<pool>/<device>.
	Health map[string]map[string]map[string]string
}

// PodSource tells what the API server knows of the node's pods. A pod it
// does not know is left out of the map.
type PodSource interface {
	Pods(ctx context.Context) (map[PodKey]PodInfo, error)
}

// HealthSource tells the health of devices no PodSource covers (a
// kubelet's own view, a plugin's): Healthy, Unhealthy or Unknown, or ""
// when it does not know the device.
type HealthSource interface {
	Health(ctx context.Context, devices []Device) (map[string]string, error)
}

// Reading is one value a DeviceCollector read for a device.
type Reading struct {
	// Device is the device read, as the collector was given it.
	Device Device
	// Name is the metric's name below dpkit_device_ (lower case, digits
	// and underscores): "utilization_ratio", "memory_used_bytes", ...
	Name string
	// Help describes the metric; the first reading of a name sets it.
	Help string
	// Value is the reading, in the base unit the name ends with.
	Value float64
}

// DeviceCollector is the hook for vendor collectors: it reads what the
// host says about some of the devices it is given (the ones it knows:
// AMDCollector takes those whose ID is an amdgpu PCI address) and returns
// a reading per device and metric. It is called once per scrape that
// reads PodResources (at most once per Config.CacheTTL) and must not keep
// devices.
type DeviceCollector interface {
	// Name names the collector in logs and in
	// dpkit_exporter_collector_errors_total.
	Name() string
	Collect(ctx context.Context, devices []Device) ([]Reading, error)
}

// Config configures an Exporter.
type Config struct {
	// Socket is the PodResources API socket (the kubelet's is
	// /var/lib/kubelet/pod-resources/kubelet.sock). Required.
	Socket string
	// CacheTTL is how long one PodResources answer serves scrapes;
	// DefaultCacheTTL when zero.
	CacheTTL time.Duration
	// Timeout bounds each PodResources call; DefaultTimeout when zero.
	Timeout time.Duration
	// Pods, when set, gives pod labels and the device health of pod
	// status.
	Pods PodSource
	// Health, when set, gives the health of devices Pods does not cover.
	Health HealthSource
	// PodLabels are the pod labels copied to every device's metrics as
	// label_<name> (non-alphanumeric characters become _); they need
	// Pods.
	PodLabels []string
	// Collectors read device utilisation and the like.
	Collectors []DeviceCollector
	// Logger; logs are discarded when nil.
	Logger *slog.Logger
	// Clock; the real clock when nil.
	Clock clock.PassiveClock
}

// Validate reports every problem of c.
func (c *Config) Validate() error {
	var errs []error
	if c.Socket == "" {
		errs = append(errs, errors.New("socket: the PodResources socket is required"))
	}
	if c.CacheTTL < 0 {
		errs = append(errs, fmt.Errorf("cacheTTL: %s is negative; use 0 for the default (%s)", c.CacheTTL, DefaultCacheTTL))
	}
	if c.Timeout < 0 {
		errs = append(errs, fmt.Errorf("timeout: %s is negative; use 0 for the default (%s)", c.Timeout, DefaultTimeout))
	}
	if len(c.PodLabels) > 0 && c.Pods == nil {
		errs = append(errs, errors.New("podLabels: pod labels come from the API server; give a PodSource (--kubeconfig) or no labels"))
	}
	seen := map[string]string{}
	for i, l := range c.PodLabels {
		if l == "" {
			errs = append(errs, fmt.Errorf("podLabels[%d]: empty label name", i))
			continue
		}
		n := PodLabelName(l)
		if prev, ok := seen[n]; ok {
			errs = append(errs, fmt.Errorf("podLabels[%d]: %q and %q are both the metric label %s; keep one", i, prev, l, n))
		}
		seen[n] = l
	}
	return errors.Join(errs...)
}

// PodLabelName is the metric label of the pod label l: label_ and l with
// every character but letters, digits and _ turned into _.
func PodLabelName(l string) string {
	b := []byte("label_" + l)
	for i := len("label_"); i < len(b); i++ {
		switch c := b[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
		default:
			b[i] = '_'
		}
	}
	return string(b)
}

// Exporter is a prometheus.Collector of a node's devices.
type Exporter struct {
	cfg     Config
	log     *slog.Logger
	clock   clock.PassiveClock
	lister  *lister
	labels  []string // device labels, pod labels last
	devDesc *prometheus.Desc
	health  *prometheus.Desc
	alloc   *prometheus.Desc
	used    *prometheus.Desc
	draUsed *prometheus.Desc
	up      *prometheus.Desc
	podsUp  *prometheus.Desc
	age     *prometheus.Desc
	reqs    *prometheus.CounterVec
	collErr *prometheus.CounterVec

	mu   sync.Mutex // held while a snapshot is taken: concurrent scrapes share it
	snap *snapshot
}

// deviceLabels are the labels of every per-device metric, before the pod
// labels.
var deviceLabels = []string{"namespace", "pod", "container", "resource", "claim_namespace", "claim", "driver", "pool", "device", "device_id", "share", "numa_node"}

// New returns an Exporter for cfg; it connects to the socket on the first
// scrape. Close releases the connection.
func New(cfg Config) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = DefaultCacheTTL
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	l, err := newLister(cfg.Socket, cfg.Timeout)
	if err != nil {
		return nil, err
	}
	labels := slices.Clone(deviceLabels)
	for _, pl := range cfg.PodLabels {
		labels = append(labels, PodLabelName(pl))
	}
	e := &Exporter{
		cfg: cfg, log: cfg.Logger, clock: cfg.Clock, lister: l, labels: labels,
		devDesc: prometheus.NewDesc("dpkit_pod_device_allocated",
			"1 for every device a pod's container holds: device plugins' by resource and device ID, DRA devices by claim, driver, pool and device.", labels, nil),
		health: prometheus.NewDesc("dpkit_pod_device_health",
			"1 for the health a held device has (Healthy, Unhealthy, Unknown), 0 for the others; only for devices whose health is known.", append(slices.Clone(labels), "health"), nil),
		alloc: prometheus.NewDesc("dpkit_node_resource_allocatable",
			"Devices of each device plugin resource the kubelet can give out (GetAllocatableResources).", []string{"resource"}, nil),
		used: prometheus.NewDesc("dpkit_node_resource_allocated",
			"Devices of each device plugin resource held by pods.", []string{"resource"}, nil),
		draUsed: prometheus.NewDesc("dpkit_node_dra_devices_allocated",
			"DRA devices held by pods' claims, by driver and pool.", []string{"driver", "pool"}, nil),
		up: prometheus.NewDesc("dpkit_exporter_podresources_up",
			"1 when the last read of the PodResources API succeeded.", nil, nil),
		podsUp: prometheus.NewDesc("dpkit_exporter_pod_source_up",
			"1 when the last read of pod labels and health from the API server succeeded.", nil, nil),
		age: prometheus.NewDesc("dpkit_exporter_snapshot_age_seconds",
			"Age of the PodResources answer this scrape reports.", nil, nil),
		reqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dpkit_exporter_podresources_requests_total",
			Help: "PodResources calls, by method and gRPC code.",
		}, []string{"method", "code"}),
		collErr: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dpkit_exporter_collector_errors_total",
			Help: "Failed reads of device collectors, pod and health sources, by source.",
		}, []string{"collector"}),
	}
	return e, nil
}

// Close closes the connection to the PodResources API.
func (e *Exporter) Close() error { return e.lister.close() }

// Describe implements prometheus.Collector. The reading metrics are
// named by the collectors, so the exporter is an unchecked collector for
// them: it sends only the fixed descriptions.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{e.devDesc, e.health, e.alloc, e.used, e.draUsed, e.up, e.age} {
		ch <- d
	}
	if e.cfg.Pods != nil {
		ch <- e.podsUp
	}
	e.reqs.Describe(ch)
	e.collErr.Describe(ch)
}

// Collect implements prometheus.Collector.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	s := e.snapshot(context.Background())
	e.emit(s, ch)
	e.reqs.Collect(ch)
	e.collErr.Collect(ch)
}

// snapshot is one read of everything a scrape reports.
type snapshot struct {
	at          time.Time
	ok          bool
	podsOK      bool
	devices     []Device // held devices
	allocatable map[string]int
	health      []string // per device in devices; "" unknown
	podLabels   [][]string
	readings    []Reading
}

// snapshot returns the devices and readings of the last PodResources
// answer, reading the API again when that answer is older than CacheTTL.
// Concurrent callers wait for one read.
func (e *Exporter) snapshot(ctx context.Context) *snapshot {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock.Now()
	if e.snap != nil && now.Sub(e.snap.at) < e.cfg.CacheTTL {
		return e.snap
	}
	e.snap = e.read(ctx, now)
	return e.snap
}

func (e *Exporter) read(ctx context.Context, now time.Time) *snapshot {
	s := &snapshot{at: now}
	pods, alloc, err := e.lister.read(ctx, e.reqs)
	if err != nil {
		e.log.Warn("Reading the PodResources API failed", "socket", e.cfg.Socket, "err", err)
		return s
	}
	s.ok = true
	s.devices = Devices(pods)
	s.allocatable = map[string]int{}
	var free []Device
	held := map[[2]string]bool{}
	for _, d := range s.devices {
		if !d.DRA() {
			held[[2]string{d.Resource, d.ID}] = true
		}
	}
	for _, cd := range alloc.GetDevices() {
		for _, id := range cd.GetDeviceIds() {
			s.allocatable[cd.GetResourceName()]++
			if !held[[2]string{cd.GetResourceName(), id}] {
				free = append(free, Device{Resource: cd.GetResourceName(), ID: id, NUMANodes: numaNodes(cd.GetTopology())})
			}
		}
	}
	s.health = make([]string, len(s.devices))
	var info map[PodKey]PodInfo
	if e.cfg.Pods != nil {
		pctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
		info, err = e.cfg.Pods.Pods(pctx)
		cancel()
		if err != nil {
			e.collErr.WithLabelValues("pods").Inc()
			e.log.Warn("Reading pods from the API server failed", "err", err)
		} else {
			s.podsOK = true
		}
	}
	var unknown []Device
	var unknownAt []int
	for i, d := range s.devices {
		p, ok := info[PodKey{d.Namespace, d.Pod}]
		if ok {
			s.health[i] = statusHealth(p.Health, d)
		}
		if s.health[i] == "" {
			unknown = append(unknown, d)
			unknownAt = append(unknownAt, i)
		}
		if len(e.cfg.PodLabels) > 0 {
			vals := make([]string, len(e.cfg.PodLabels))
			for j, l := range e.cfg.PodLabels {
				vals[j] = p.Labels[l]
			}
			s.podLabels = append(s.podLabels, vals)
		}
	}
	if e.cfg.Health != nil && len(unknown) > 0 {
		h, err := e.cfg.Health.Health(ctx, unknown)
		if err != nil {
			e.collErr.WithLabelValues("health").Inc()
			e.log.Warn("Reading device health failed", "err", err)
		}
		for j, d := range unknown {
			s.health[unknownAt[j]] = h[d.ID]
		}
	}
	all := append(slices.Clone(s.devices), free...)
	for _, c := range e.cfg.Collectors {
		r, err := c.Collect(ctx, all)
		if err != nil {
			e.collErr.WithLabelValues(c.Name()).Inc()
			e.log.Warn("A device collector failed", "collector", c.Name(), "err", err)
		}
		for _, x := range r {
			if !readingName.MatchString(x.Name) {
				e.collErr.WithLabelValues(c.Name()).Inc()
				e.log.Warn("A device collector returned a bad metric name", "collector", c.Name(), "name", x.Name)
				continue
			}
			s.readings = append(s.readings, x)
		}
	}
	return s
}

var readingName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// statusHealth finds d in the device health of a pod's status.
func statusHealth(h map[string]map[string]map[string]string, d Device) string {
	byRes := h[d.Container]
	if !d.DRA() {
		return byRes[d.Resource][d.ID]
	}
	// The status names a claim as the pod spec refers to it
	// (pod.spec.resourceClaims[].name), which PodResources does not
	// report: PodResources names the ResourceClaim. A device's health is
	// the device's, whatever claim of the container holds it, so it is
	// looked for under every claim of the container.
	for name, ids := range byRes {
		if !strings.HasPrefix(name, "claim:") {
			continue
		}
		if v, ok := ids[d.ID]; ok {
			return v
		}
		if len(d.CDIDevices) > 0 {
			if v, ok := ids[d.CDIDevices[0]]; ok {
				return v
			}
		}
	}
	return ""
}

// Devices flattens a PodResources List answer into one Device per device
// a container holds.
func Devices(pods []*podresourcesv1.PodResources) []Device {
	var out []Device
	for _, p := range pods {
		for _, c := range p.GetContainers() {
			for _, cd := range c.GetDevices() {
				for _, id := range cd.GetDeviceIds() {
					out = append(out, Device{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName(),
						Resource: cd.GetResourceName(), ID: id, NUMANodes: numaNodes(cd.GetTopology())})
				}
			}
			for _, dr := range c.GetDynamicResources() {
				for _, cr := range dr.GetClaimResources() {
					d := Device{Namespace: p.GetNamespace(), Pod: p.GetName(), Container: c.GetName(),
						ClaimNamespace: dr.GetClaimNamespace(), Claim: dr.GetClaimName(),
						Driver: cr.GetDriverName(), Pool: cr.GetPoolName(), Name: cr.GetDeviceName(),
						ID: cr.GetDriverName() + "/" + cr.GetPoolName() + "/" + cr.GetDeviceName(), Share: cr.GetShareId()}
					for _, cdi := range cr.GetCdiDevices() {
						d.CDIDevices = append(d.CDIDevices, cdi.GetName())
					}
					out = append(out, d)
				}
			}
		}
	}
	return out
}

func numaNodes(t *podresourcesv1.TopologyInfo) []int64 {
	var out []int64
	for _, n := range t.GetNodes() {
		out = append(out, n.GetID())
	}
	return out
}

func (d Device) labelValues() []string {
	numa := make([]string, len(d.NUMANodes))
	for i, n := range d.NUMANodes {
		numa[i] = strconv.FormatInt(n, 10)
	}
	return []string{d.Namespace, d.Pod, d.Container, d.Resource, d.ClaimNamespace, d.Claim, d.Driver, d.Pool, d.Name, d.ID, d.Share, strings.Join(numa, ",")}
}

func (e *Exporter) emit(s *snapshot, ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(e.up, prometheus.GaugeValue, b2f(s.ok))
	ch <- prometheus.MustNewConstMetric(e.age, prometheus.GaugeValue, e.clock.Since(s.at).Seconds())
	if e.cfg.Pods != nil {
		ch <- prometheus.MustNewConstMetric(e.podsUp, prometheus.GaugeValue, b2f(s.podsOK))
	}
	if !s.ok {
		return
	}
	used := map[string]int{}
	draUsed := map[[2]string]int{}
	// Where one device is held by several containers (a pod's init
	// container and its app container), the series are the same only
	// if the labels are: they never are, since the container differs.
	held := map[string][]string{} // device key -> label values, for readings
	for i, d := range s.devices {
		vals := d.labelValues()
		if s.podLabels != nil {
			vals = append(vals, s.podLabels[i]...)
		}
		ch <- prometheus.MustNewConstMetric(e.devDesc, prometheus.GaugeValue, 1, vals...)
		if h := s.health[i]; h != "" {
			for _, state := range []string{Healthy, Unhealthy, Unknown} {
				ch <- prometheus.MustNewConstMetric(e.health, prometheus.GaugeValue, b2f(h == state), append(slices.Clone(vals), state)...)
			}
		}
		if d.DRA() {
			draUsed[[2]string{d.Driver, d.Pool}]++
		} else {
			used[d.Resource]++
		}
		if _, ok := held[deviceKey(d)]; !ok {
			held[deviceKey(d)] = vals
		}
	}
	for r, n := range s.allocatable {
		ch <- prometheus.MustNewConstMetric(e.alloc, prometheus.GaugeValue, float64(n), r)
		ch <- prometheus.MustNewConstMetric(e.used, prometheus.GaugeValue, float64(used[r]), r)
	}
	for r, n := range used {
		if _, ok := s.allocatable[r]; !ok {
			ch <- prometheus.MustNewConstMetric(e.used, prometheus.GaugeValue, float64(n), r)
		}
	}
	for k, n := range draUsed {
		ch <- prometheus.MustNewConstMetric(e.draUsed, prometheus.GaugeValue, float64(n), k[0], k[1])
	}
	descs := map[string]*prometheus.Desc{}
	sent := map[string]bool{}
	for _, r := range s.readings {
		desc, ok := descs[r.Name]
		if !ok {
			help := r.Help
			if help == "" {
				help = "A device reading of a dpkit exporter collector."
			}
			desc = prometheus.NewDesc("dpkit_device_"+r.Name, help, e.labels, nil)
			descs[r.Name] = desc
		}
		vals, ok := held[deviceKey(r.Device)]
		if !ok {
			vals = append(r.Device.labelValues(), make([]string, len(e.cfg.PodLabels))...)
		}
		key := r.Name + "\x00" + strings.Join(vals, "\x00")
		if sent[key] {
			continue // a collector that read one device twice
		}
		sent[key] = true
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, r.Value, vals...)
	}
}

func deviceKey(d Device) string {
	if d.DRA() {
		return "dra\x00" + d.ID
	}
	return d.Resource + "\x00" + d.ID
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
