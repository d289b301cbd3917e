package nodeapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestMetricsServed: with Source.Metrics the handler serves /metrics from
// it (authorized as the nodes/metrics subresource, see TestAttributes),
// and every other path as before; without it /metrics is not found.
func TestMetricsServed(t *testing.T) {
	t.Parallel()
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "dra_resource_claims_in_use 1\n")
	})
	get := func(h http.Handler, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	h := Handler(Source{NodeName: "vn1", Metrics: metrics})
	if code, body := get(h, "/metrics"); code != http.StatusOK || body != "dra_resource_claims_in_use 1\n" {
		t.Fatalf("GET /metrics: %d %q, want the metrics handler's answer", code, body)
	}
	if code, body := get(h, "/metrics/resource"); code == http.StatusOK && body == "dra_resource_claims_in_use 1\n" {
		t.Fatal("GET /metrics/resource served by the metrics handler")
	}
	if code, _ := get(Handler(Source{NodeName: "vn1"}), "/metrics"); code != http.StatusNotFound {
		t.Fatalf("GET /metrics without Metrics: %d, want 404", code)
	}
}
