package exporter

import (
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// benchNode is a node with 1000 allocated devices: 250 pods holding four
// device plugin devices each... or, with dra, 125 pods holding four of a
// device plugin's and four DRA devices each.
func benchNode(dra bool) *fakeNode {
	n := &fakeNode{}
	var all []string
	perPod, pods := 4, 250
	if dra {
		pods = 125
	}
	for p := range pods {
		ids := make([]string, perPod)
		for i := range ids {
			ids[i] = fmt.Sprintf("gpu%d", p*perPod+i)
		}
		all = append(all, ids...)
		var claims []*podresourcesv1.DynamicResource
		if dra {
			for i := range perPod {
				claims = append(claims, claim("ns", fmt.Sprintf("claim-%d-%d", p, i), fmt.Sprintf("dev-%d", p*perPod+i))...)
			}
		}
		n.addPod("ns", fmt.Sprintf("pod-%d", p), "main", gpu(ids...), claims)
	}
	n.allocatable = gpu(all...)
	return n
}

// BenchmarkScrape is one Prometheus scrape of /metrics with 1000 devices
// held by pods: "miss" reads PodResources (List and
// GetAllocatableResources over a unix socket) and builds every series,
// "cached" answers from the last read (scrapes within CacheTTL). It
// reports the heap in use after the scrapes (heap-MiB) and the bytes of
// the answer.
//
//	go test -run '^$' -bench Scrape -benchmem ./pkg/exporter/
func BenchmarkScrape(b *testing.B) {
	for _, mode := range []struct {
		name   string
		dra    bool
		miss   bool
		health bool
	}{{"dp/miss", false, true, false}, {"dp/cached", false, false, false}, {"dp+dra/miss", true, true, false}, {"dp+dra+health/miss", true, true, true}} {
		b.Run(mode.name, func(b *testing.B) {
			socket := filepath.Join(b.TempDir(), "kubelet.sock")
			n := benchNode(mode.dra)
			serveQPS(b, n, socket, -1)
			cfg := Config{Socket: socket}
			if mode.health {
				cfg.Health = benchDRAHealth(b, n)
			}
			e, fc := newExporter(b, cfg)
			reg := prometheus.NewRegistry()
			reg.MustRegister(e)
			h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
			scrape := func() int {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
				if rec.Code != 200 {
					b.Fatalf("scrape: %d", rec.Code)
				}
				return rec.Body.Len()
			}
			size := scrape()
			b.ResetTimer()
			for b.Loop() {
				if mode.miss {
					fc.Step(DefaultCacheTTL)
				}
				scrape()
			}
			b.StopTimer()
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "heap-MiB")
			b.ReportMetric(float64(size), "body-bytes")
		})
	}
}

// benchDRAHealth is a DRAHealth whose driver has reported every DRA
// device of n Healthy, with an hour's timeout.
func benchDRAHealth(b *testing.B, n *fakeNode) *DRAHealth {
	b.Helper()
	dir := b.TempDir()
	drv := &healthDriver{reports: make(chan *drahealthv1.NodeWatchResourcesResponse, 1), opened: make(chan struct{}, 1)}
	serveDriver(b, dir, "fake.dpkit.io", drv)
	h, err := NewDRAHealth(DRAHealthConfig{PluginsDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = h.Close() })
	var devs []Device
	rep := &drahealthv1.NodeWatchResourcesResponse{}
	for _, claims := range n.dra {
		for _, dr := range claims {
			for _, cr := range dr.ClaimResources {
				devs = append(devs, Device{Driver: cr.DriverName, Pool: cr.PoolName, Name: cr.DeviceName, ID: cr.DriverName + "/" + cr.PoolName + "/" + cr.DeviceName})
				rep.Devices = append(rep.Devices, &drahealthv1.DeviceHealth{
					Device: &drahealthv1.DeviceIdentifier{PoolName: cr.PoolName, DeviceName: cr.DeviceName},
					Health: drahealthv1.HealthStatus_HEALTHY, HealthCheckTimeoutSeconds: 3600,
				})
			}
		}
	}
	if _, err := h.Health(b.Context(), devs[:1]); err != nil {
		b.Fatal(err)
	}
	<-drv.opened
	drv.reports <- rep
	healthBecomes(b, h, devs[len(devs)-1], Healthy)
	return h
}
