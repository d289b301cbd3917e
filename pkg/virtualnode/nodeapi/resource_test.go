package nodeapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

// fakeBackend runs nothing; its pods are what the test gives.
type fakeBackend struct{ pods []*corev1.Pod }

func (*fakeBackend) CreatePod(context.Context, *corev1.Pod) error { return nil }
func (*fakeBackend) DeletePod(context.Context, *corev1.Pod) error { return nil }
func (*fakeBackend) Forget(context.Context, *corev1.Pod) error    { return nil }
func (b *fakeBackend) Pods() []*corev1.Pod                        { return b.pods }
func (*fakeBackend) Close() error                                 { return nil }

// measured adds PodStats: each running container used 1.5 s of CPU and
// holds 1000 bytes.
type measured struct{ fakeBackend }

func (b *measured) PodStats(context.Context) ([]statsv1alpha1.PodStats, error) {
	now := metav1.NewTime(time.Unix(2000, 0))
	var out []statsv1alpha1.PodStats
	for _, p := range zeroStats(b.pods) {
		var pc, pm uint64
		for i := range p.Containers {
			c, m := uint64(1500*time.Millisecond), uint64(1000)
			p.Containers[i].CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &c}
			p.Containers[i].Memory = &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &m}
			pc, pm = pc+c, pm+m
		}
		p.CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &pc}
		p.Memory = &statsv1alpha1.MemoryStats{Time: now, WorkingSetBytes: &pm}
		out = append(out, p)
	}
	return out, nil
}

// runningPod has containers running and containers exited.
func runningPod(name string, running []string, exited ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}}
	started := metav1.NewTime(time.Unix(1000, 0))
	for _, c := range running {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "img-" + c, Env: []corev1.EnvVar{{Name: "SECRET", Value: "x"}}})
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}})
	}
	for _, c := range exited {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: c, Image: "img-" + c})
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: c, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}})
	}
	return p
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// samples parses a text exposition into name{labels} -> value, and checks
// that every usage sample carries a timestamp, as the kubelet's do.
func samples(t *testing.T, body string) map[string]float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse %q: %v", body, err)
	}
	out := map[string]float64{}
	for name, mf := range families {
		for _, m := range mf.Metric {
			key := name
			for _, l := range m.Label {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[key] = v
			if strings.Contains(name, "usage") || strings.Contains(name, "working_set") {
				if m.TimestampMs == nil {
					t.Errorf("%s has no timestamp", key)
				}
			}
		}
	}
	return out
}

// TestResourceMetrics checks /metrics/resource has the kubelet's resource
// metrics for what the backend measures (the node's being the sum of its
// pods'), zero for a backend that measures nothing, and the same numbers
// in /stats/summary.
func TestResourceMetrics(t *testing.T) {
	t.Parallel()
	a, b := runningPod("a", []string{"c1", "c2"}), runningPod("b", []string{"c1"}, "done")
	for _, tc := range []struct {
		name string
		be   backend.Backend
		want map[string]float64
	}{
		{"measured", &measured{fakeBackend{pods: []*corev1.Pod{a, b}}}, map[string]float64{
			"node_cpu_usage_seconds_total":                                       4.5,
			"node_memory_working_set_bytes":                                      3000,
			"container_cpu_usage_seconds_total,container=c2,namespace=ns,pod=a":  1.5,
			"container_memory_working_set_bytes,container=c1,namespace=ns,pod=b": 1000,
			"container_start_time_seconds,container=c1,namespace=ns,pod=a":       1000,
			"pod_cpu_usage_seconds_total,namespace=ns,pod=a":                     3,
			"pod_memory_working_set_bytes,namespace=ns,pod=b":                    1000,
			"resource_scrape_error":                                              0,
		}},
		{"nothing measured", &fakeBackend{pods: []*corev1.Pod{a, b}}, map[string]float64{
			"node_cpu_usage_seconds_total":                                       0,
			"node_memory_working_set_bytes":                                      0,
			"container_cpu_usage_seconds_total,container=c2,namespace=ns,pod=a":  0,
			"container_memory_working_set_bytes,container=c1,namespace=ns,pod=b": 0,
			"pod_cpu_usage_seconds_total,namespace=ns,pod=a":                     0,
			"resource_scrape_error":                                              0,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := Handler(Source{NodeName: "vn1", Backend: tc.be})
			code, body := get(t, h, "/metrics/resource")
			if code != http.StatusOK {
				t.Fatalf("GET /metrics/resource: %d %q", code, body)
			}
			got := samples(t, body)
			for k, v := range tc.want {
				if g, ok := got[k]; !ok || g != v {
					t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
				}
			}
			for k := range got {
				if strings.Contains(k, "container=done") {
					t.Errorf("exited container reported: %s", k)
				}
			}
			code, body = get(t, h, "/stats/summary")
			var s statsv1alpha1.Summary
			if code != http.StatusOK || json.Unmarshal([]byte(body), &s) != nil {
				t.Fatalf("GET /stats/summary: %d %q", code, body)
			}
			if s.Node.CPU == nil || float64(*s.Node.CPU.UsageCoreNanoSeconds)/1e9 != tc.want["node_cpu_usage_seconds_total"] || len(s.Pods) != 2 {
				t.Errorf("summary node %+v, %d pods; want the node's CPU as in the metrics and 2 pods", s.Node.CPU, len(s.Pods))
			}
		})
	}
}

// TestRunningPodsHealthzConfigz checks /runningpods/ lists the backend's
// pods with running containers, stripped as the kubelet's are; /healthz
// and its checks answer ok; /configz has the configuration under
// kubeletconfig.
func TestRunningPodsHealthzConfigz(t *testing.T) {
	t.Parallel()
	be := &fakeBackend{pods: []*corev1.Pod{runningPod("b", []string{"c1"}, "done"), runningPod("a", []string{"c1"}), runningPod("ended", nil, "done")}}
	h := Handler(Source{NodeName: "vn1", Backend: be, Config: KubeletConfig{Port: 10250, Authorization: KubeletAuthorization{Mode: "Webhook"}}})

	code, body := get(t, h, "/runningpods/")
	var list corev1.PodList
	if code != http.StatusOK || json.Unmarshal([]byte(body), &list) != nil {
		t.Fatalf("GET /runningpods/: %d %q", code, body)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
		if len(p.Spec.Containers) != 1 || p.Spec.Containers[0].Image != "img-c1" || p.Spec.Containers[0].Env != nil || p.Status.Phase != "" {
			t.Errorf("pod %s: %+v, want only its running container's name and image", p.Name, p.Spec)
		}
	}
	if strings.Join(names, ",") != "a,b" {
		t.Errorf("running pods %v, want a,b", names)
	}

	for path, want := range map[string]string{
		"/healthz":          "ok",
		"/healthz/ping":     "ok",
		"/healthz/syncloop": "ok",
		"/healthz?verbose":  "[+]ping ok\n[+]log ok\n[+]syncloop ok\nhealthz check passed\n",
	} {
		if code, body := get(t, h, path); code != http.StatusOK || body != want {
			t.Errorf("GET %s: %d %q, want 200 %q", path, code, body, want)
		}
	}
	if code, _ := get(t, h, "/healthz/nope"); code != http.StatusNotFound {
		t.Errorf("GET /healthz/nope: %d, want 404", code)
	}

	code, body = get(t, h, "/configz")
	var cz struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &cz) != nil {
		t.Fatalf("GET /configz: %d %q", code, body)
	}
	if cz.KubeletConfig["kind"] != "KubeletConfiguration" || cz.KubeletConfig["apiVersion"] != "kubelet.config.k8s.io/v1beta1" ||
		cz.KubeletConfig["port"] != float64(10250) || cz.KubeletConfig["authorization"].(map[string]any)["mode"] != "Webhook" {
		t.Errorf("configz %s", body)
	}
}
