package nodeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// summary is the node's stats summary: the backend's measure of its pods
// when it has one (StatsProvider), otherwise zero usage for each pod with
// a running container (nothing runs to be measured). The node's usage is
// the sum of its pods': a virtual node has no machine of its own to
// measure.
func summary(ctx context.Context, src Source) (*statsv1alpha1.Summary, error) {
	var pods []statsv1alpha1.PodStats
	if sp, ok := src.Backend.(backend.StatsProvider); ok {
		var err error
		if pods, err = sp.PodStats(ctx); err != nil {
			return nil, err
		}
	} else if src.Backend != nil {
		pods = zeroStats(src.Backend.Pods())
	}
	now := metav1.Now()
	var cpu, mem uint64
	for _, p := range pods {
		if p.CPU != nil && p.CPU.UsageCoreNanoSeconds != nil {
			cpu += *p.CPU.UsageCoreNanoSeconds
		}
		if p.Memory != nil && p.Memory.WorkingSetBytes != nil {
			mem += *p.Memory.WorkingSetBytes
		}
	}
	s := &statsv1alpha1.Summary{Pods: pods}
	s.Node.NodeName = src.NodeName
	s.Node.StartTime.Time = src.StartTime
	s.Node.CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &cpu}
	s.Node.Memory = &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &mem}
	return s, nil
}

// zeroStats reports zero usage for the running containers of pods.
func zeroStats(pods []*corev1.Pod) []statsv1alpha1.PodStats {
	now := metav1.Now()
	var out []statsv1alpha1.PodStats
	for _, p := range pods {
		ps := statsv1alpha1.PodStats{PodRef: statsv1alpha1.PodReference{Name: p.Name, Namespace: p.Namespace, UID: string(p.UID)}}
		if p.Status.StartTime != nil {
			ps.StartTime = *p.Status.StartTime
		}
		for _, cs := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			if cs.State.Running == nil {
				continue
			}
			var zero uint64
			ps.Containers = append(ps.Containers, statsv1alpha1.ContainerStats{
				Name:      cs.Name,
				StartTime: cs.State.Running.StartedAt,
				CPU:       &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &zero},
				Memory:    &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &zero},
			})
		}
		if len(ps.Containers) == 0 {
			continue
		}
		var zero uint64
		ps.CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &zero}
		ps.Memory = &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &zero}
		out = append(out, ps)
	}
	return out
}

// The kubelet's resource metrics (pkg/kubelet/metrics/collectors,
// resource_metrics.go), which metrics-server reads for kubectl top.
var (
	containerLabels = []string{"container", "pod", "namespace"}
	podLabels       = []string{"pod", "namespace"}

	nodeCPUUsageDesc = prometheus.NewDesc("node_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the node in core-seconds", nil, nil)
	nodeMemoryUsageDesc = prometheus.NewDesc("node_memory_working_set_bytes",
		"[STABLE] Current working set of the node in bytes", nil, nil)
	containerCPUUsageDesc = prometheus.NewDesc("container_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the container in core-seconds", containerLabels, nil)
	containerMemoryUsageDesc = prometheus.NewDesc("container_memory_working_set_bytes",
		"[STABLE] Current working set of the container in bytes", containerLabels, nil)
	containerStartTimeDesc = prometheus.NewDesc("container_start_time_seconds",
		"[STABLE] Start time of the container since unix epoch in seconds", containerLabels, nil)
	podCPUUsageDesc = prometheus.NewDesc("pod_cpu_usage_seconds_total",
		"[STABLE] Cumulative cpu time consumed by the pod in core-seconds", podLabels, nil)
	podMemoryUsageDesc = prometheus.NewDesc("pod_memory_working_set_bytes",
		"[STABLE] Current working set of the pod in bytes", podLabels, nil)
	resourceScrapeErrorDesc = prometheus.NewDesc("resource_scrape_error",
		"[STABLE] 1 if there was an error while getting container metrics, 0 otherwise", nil, nil)
)

// resourceCollector emits one summary as the kubelet's resource metrics,
// each usage sample with the time it was measured.
type resourceCollector struct {
	s   *statsv1alpha1.Summary
	err error
}

func (c resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{nodeCPUUsageDesc, nodeMemoryUsageDesc, containerCPUUsageDesc, containerMemoryUsageDesc,
		containerStartTimeDesc, podCPUUsageDesc, podMemoryUsageDesc, resourceScrapeErrorDesc} {
		ch <- d
	}
}

func (c resourceCollector) Collect(ch chan<- prometheus.Metric) {
	errs := 0.0
	if c.err != nil {
		errs = 1
	}
	ch <- prometheus.MustNewConstMetric(resourceScrapeErrorDesc, prometheus.GaugeValue, errs)
	if c.s == nil {
		return
	}
	cpu := func(d *prometheus.Desc, s *statsv1alpha1.CPUStats, labels ...string) {
		if s != nil && s.UsageCoreNanoSeconds != nil {
			ch <- prometheus.NewMetricWithTimestamp(s.Time.Time, prometheus.MustNewConstMetric(d, prometheus.CounterValue,
				float64(*s.UsageCoreNanoSeconds)/float64(time.Second), labels...))
		}
	}
	mem := func(d *prometheus.Desc, s *statsv1alpha1.MemoryStats, labels ...string) {
		if s != nil && s.WorkingSetBytes != nil {
			ch <- prometheus.NewMetricWithTimestamp(s.Time.Time, prometheus.MustNewConstMetric(d, prometheus.GaugeValue,
				float64(*s.WorkingSetBytes), labels...))
		}
	}
	cpu(nodeCPUUsageDesc, c.s.Node.CPU)
	mem(nodeMemoryUsageDesc, c.s.Node.Memory)
	for _, p := range c.s.Pods {
		for _, ct := range p.Containers {
			if ct.StartTime.Unix() > 0 {
				ch <- prometheus.MustNewConstMetric(containerStartTimeDesc, prometheus.GaugeValue,
					float64(ct.StartTime.UnixNano())/float64(time.Second), ct.Name, p.PodRef.Name, p.PodRef.Namespace)
			}
			cpu(containerCPUUsageDesc, ct.CPU, ct.Name, p.PodRef.Name, p.PodRef.Namespace)
			mem(containerMemoryUsageDesc, ct.Memory, ct.Name, p.PodRef.Name, p.PodRef.Namespace)
		}
		cpu(podCPUUsageDesc, p.CPU, p.PodRef.Name, p.PodRef.Namespace)
		mem(podMemoryUsageDesc, p.Memory, p.PodRef.Name, p.PodRef.Namespace)
	}
}

// resourceMetrics serves /metrics/resource: the summary measured for
// this request, in the kubelet's format (Prometheus text, or what the
// client negotiates).
func resourceMetrics(src Source) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s, err := summary(r.Context(), src)
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(resourceCollector{s: s, err: err})
		promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
}

// runningPods are the pods the backend runs, as the kubelet's
// /runningpods/ lists the runtime's: name, namespace, UID and the
// running containers' names and images, nothing else.
func runningPods(b backend.Backend) func(context.Context) ([]*corev1.Pod, error) {
	return func(context.Context) ([]*corev1.Pod, error) {
		if b == nil {
			return nil, nil
		}
		var out []*corev1.Pod
		for _, p := range b.Pods() {
			images := map[string]string{}
			for _, c := range append(append([]corev1.Container(nil), p.Spec.InitContainers...), p.Spec.Containers...) {
				images[c.Name] = c.Image
			}
			rp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID}}
			for _, cs := range append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
				if cs.State.Running != nil {
					rp.Spec.Containers = append(rp.Spec.Containers, corev1.Container{Name: cs.Name, Image: images[cs.Name]})
				}
			}
			if len(rp.Spec.Containers) > 0 {
				out = append(out, rp)
			}
		}
		backend.SortPods(out)
		return out, nil
	}
}

// healthChecks are the kubelet's /healthz checks; each passes while the
// node serves.
var healthChecks = []string{"ping", "log", "syncloop"}

// healthz serves /healthz and /healthz/<check> as the kubelet does
// (k8s.io/apiserver's healthz): "ok", or with ?verbose each check.
func healthz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	name := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/healthz"), "/")
	if name != "" {
		for _, c := range healthChecks {
			if c == name {
				_, _ = fmt.Fprint(w, "ok")
				return
			}
		}
		http.NotFound(w, r)
		return
	}
	if _, ok := r.URL.Query()["verbose"]; !ok {
		_, _ = fmt.Fprint(w, "ok")
		return
	}
	for _, c := range healthChecks {
		_, _ = fmt.Fprintf(w, "[+]%s ok\n", c)
	}
	_, _ = fmt.Fprint(w, "healthz check passed\n")
}

// KubeletConfig is what /configz reports under "kubeletconfig", as the
// kubelet reports its KubeletConfiguration: the fields of
// kubelet.config.k8s.io/v1beta1 that mean something for a virtual node,
// under their names there. Kind and APIVersion are filled in.
type KubeletConfig struct {
	Kind                     string                `json:"kind"`
	APIVersion               string                `json:"apiVersion"`
	EnableServer             bool                  `json:"enableServer"`
	Address                  string                `json:"address,omitempty"`
	Port                     int32                 `json:"port"`
	TLSCertFile              string                `json:"tlsCertFile,omitempty"`
	TLSPrivateKeyFile        string                `json:"tlsPrivateKeyFile,omitempty"`
	Authentication           KubeletAuthentication `json:"authentication"`
	Authorization            KubeletAuthorization  `json:"authorization"`
	RegisterWithTaints       []corev1.Taint        `json:"registerWithTaints,omitempty"`
	NodeLeaseDurationSeconds int32                 `json:"nodeLeaseDurationSeconds,omitempty"`
	TopologyManagerPolicy    string                `json:"topologyManagerPolicy,omitempty"`
	TopologyManagerScope     string                `json:"topologyManagerScope,omitempty"`
}

// KubeletAuthentication is KubeletConfiguration's authentication.
type KubeletAuthentication struct {
	X509      KubeletX509Authentication      `json:"x509"`
	Webhook   KubeletWebhookAuthentication   `json:"webhook"`
	Anonymous KubeletAnonymousAuthentication `json:"anonymous"`
}

// KubeletX509Authentication is authentication.x509.
type KubeletX509Authentication struct {
	ClientCAFile string `json:"clientCAFile,omitempty"`
}

// KubeletWebhookAuthentication is authentication.webhook.
type KubeletWebhookAuthentication struct {
	Enabled  bool            `json:"enabled"`
	CacheTTL metav1.Duration `json:"cacheTTL"`
}

// KubeletAnonymousAuthentication is authentication.anonymous.
type KubeletAnonymousAuthentication struct {
	Enabled bool `json:"enabled"`
}

// KubeletAuthorization is KubeletConfiguration's authorization.
type KubeletAuthorization struct {
	Mode    string                      `json:"mode"`
	Webhook KubeletWebhookAuthorization `json:"webhook"`
}

// KubeletWebhookAuthorization is authorization.webhook.
type KubeletWebhookAuthorization struct {
	CacheAuthorizedTTL   metav1.Duration `json:"cacheAuthorizedTTL"`
	CacheUnauthorizedTTL metav1.Duration `json:"cacheUnauthorizedTTL"`
}

// configz serves cfg as the kubelet's /configz does.
func configz(cfg KubeletConfig) http.Handler {
	cfg.Kind, cfg.APIVersion = "KubeletConfiguration", "kubelet.config.k8s.io/v1beta1"
	body, err := json.Marshal(map[string]KubeletConfig{"kubeletconfig": cfg})
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
}
