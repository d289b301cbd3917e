package draverify

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpkit/dpkit/pkg/verify"
)

// TestDescribe: a request is named the way an RBAC rule grants it.
func TestDescribe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		method, url, what, ns string
	}{
		{"GET", "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/claim-a", `get resource "resourceclaims" in API group "resource.k8s.io"`, "ns1"},
		{"GET", "/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName%3Dn1", `list resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"GET", "/apis/resource.k8s.io/v1/resourceslices?watch=true", `watch resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"POST", "/apis/resource.k8s.io/v1/resourceslices", `create resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"PUT", "/apis/resource.k8s.io/v1/resourceslices/s1", `update resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"PATCH", "/apis/resource.k8s.io/v1/resourceslices/s1", `patch resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"DELETE", "/apis/resource.k8s.io/v1/resourceslices/s1", `delete resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"DELETE", "/apis/resource.k8s.io/v1/resourceslices", `deletecollection resource "resourceslices" in API group "resource.k8s.io"`, ""},
		{"PUT", "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/c/status", `update resource "resourceclaims/status" in API group "resource.k8s.io"`, "ns1"},
		{"GET", "/api/v1/nodes/n1", `get resource "nodes" in the core API group`, ""},
		{"POST", "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases", `create resource "leases" in API group "coordination.k8s.io"`, "kube-system"},
		{"GET", "/version", `get path "/version"`, ""},
	} {
		r := httptest.NewRequest(tc.method, tc.url, nil)
		what, ns := describe(r)
		if what != tc.what || ns != tc.ns {
			t.Errorf("%s %s: %q in %q, want %q in %q", tc.method, tc.url, what, ns, tc.what, tc.ns)
		}
	}
}

// forbidden writes the Status the API server's authorizer writes.
func forbidden(w http.ResponseWriter, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusForbidden)
	_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden, Message: message})
}

// TestProxy: the driver reaches the API server through the proxy with its
// own token (and never with verify's credentials), watches stream through
// it, and every request the authorizer forbids is recorded, named as RBAC
// grants it, before the driver has the answer; a 403 of an admission
// plugin is not the driver's RBAC.
func TestProxy(t *testing.T) {
	t.Parallel()
	const prefix = "/k8s/clusters/c1" // a cluster behind a gateway
	var mu sync.Mutex
	var auth []string
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/nodes/n1", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}`)
	})
	mux.HandleFunc("GET /apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims/claim-a", func(w http.ResponseWriter, _ *http.Request) {
		forbidden(w, `resourceclaims.resource.k8s.io "claim-a" is forbidden: User "system:serviceaccount:ns1:driver" cannot get resource "resourceclaims" in API group "resource.k8s.io" in the namespace "ns1"`)
	})
	mux.HandleFunc("DELETE /apis/resource.k8s.io/v1/resourceslices", func(w http.ResponseWriter, _ *http.Request) {
		forbidden(w, `resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:ns1:driver" cannot deletecollection resource "resourceslices" in API group "resource.k8s.io" at the cluster scope`)
	})
	mux.HandleFunc("POST /apis/resource.k8s.io/v1/resourceslices", func(w http.ResponseWriter, _ *http.Request) {
		forbidden(w, `resourceslices.resource.k8s.io "s1" is forbidden: admission webhook "deny.example.com" denied the request`)
	})
	mux.HandleFunc("GET /apis/resource.k8s.io/v1/resourceslices", func(w http.ResponseWriter, r *http.Request) {
		// A watch: one event, then nothing until the client goes.
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"type":"ADDED","object":{"kind":"ResourceSlice","apiVersion":"resource.k8s.io/v1","metadata":{"name":"s1"},"spec":{"driver":"d","pool":{"name":"p","generation":1,"resourceSliceCount":1},"nodeName":"n1"}}}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		http.StripPrefix(prefix, mux).ServeHTTP(w, r)
	}))
	defer upstream.Close()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw})
	verifysConfig := &rest.Config{Host: upstream.URL + prefix, BearerToken: "verifys-own-secret", TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	p, err := startProxy(verifysConfig, time.Hour, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()

	driver, err := kubernetes.NewForConfig(&rest.Config{Host: p.url, BearerToken: "driver-token", ContentConfig: rest.ContentConfig{ContentType: "application/json"},
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if n, err := driver.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil || n.Name != "n1" {
		t.Errorf("get node n1 through the proxy: %v, %v", n, err)
	}
	if p.anyDenied() {
		t.Errorf("denials %v after an allowed request", p.denials())
	}
	_, err = driver.ResourceV1().ResourceClaims("ns1").Get(ctx, "claim-a", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("get claim-a: %v, want the API server's forbidden", err)
	}
	// Recorded by the time the driver has the answer.
	if !p.anyDenied() {
		t.Error("no denial recorded when the driver had the answer")
	}
	for range 2 {
		if err := driver.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("deletecollection: %v, want forbidden", err)
		}
	}
	if _, err := driver.ResourceV1().ResourceSlices().Create(ctx, slice("s1", "n1", ""), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a slice: %v, want the admission plugin's forbidden", err)
	}
	w, err := driver.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != "ADDED" {
			t.Errorf("watch event %v, want ADDED", ev)
		}
	case <-time.After(10 * time.Second):
		t.Error("the watch's first event did not come through while the watch stays open")
	}
	w.Stop()
	// A request without a token gets none of verify's.
	anonymous, err := kubernetes.NewForConfig(&rest.Config{Host: p.url, ContentConfig: rest.ContentConfig{ContentType: "application/json"},
		TLSClientConfig: rest.TLSClientConfig{CAData: p.caPEM}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anonymous.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Errorf("get node n1 without a token: %v", err)
	}

	var got []string
	for _, d := range p.denials() {
		got = append(got, d.String())
	}
	want := []string{
		`deletecollection resource "resourceslices" in API group "resource.k8s.io" (2 times)`,
		`get resource "resourceclaims" in API group "resource.k8s.io" in namespace ns1`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("denials:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	pass, detail, err := p.rbacVerdict("the test's RBAC")
	if pass || err != nil || !strings.Contains(detail, want[0]) || !strings.Contains(detail, "granted the test's RBAC") {
		t.Errorf("rbacVerdict: %v, %q, %v; want a failure naming what was forbidden", pass, detail, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auth) != 7 || auth[6] != "" {
		t.Errorf("the API server got Authorization %q, want the driver's token six times, then none", auth)
	}
	for _, a := range auth[:min(6, len(auth))] {
		if a != "Bearer driver-token" {
			t.Errorf("the API server got Authorization %q, want only the driver's token", a)
		}
	}
}

// TestOneCause: once the API server has refused the driver a request, a
// check that fails is skipped, pointing to dra.rbac, whose verdict only
// judgeRBAC gives.
func TestOneCause(t *testing.T) {
	t.Parallel()
	p := &apiProxy{denied: map[string]*denial{}}
	r := &run{log: slog.New(slog.DiscardHandler), results: map[string]*verify.Result{}, sb: &sandbox{proxy: p, ctx: t.Context(), grant: defaultGrant()}}
	for _, c := range verify.DRAChecks() {
		r.results[c.ID] = &verify.Result{}
	}
	r.set(verify.CheckDRASlices, verify.Fail, "no slices")
	r.skipRest("see " + verify.CheckDRASlices)
	if res := r.results[verify.CheckDRASlices]; res.Verdict != verify.Fail {
		t.Errorf("%s before any refusal: %+v, want it failed", verify.CheckDRASlices, res)
	}
	if res := r.results[verify.CheckDRARBAC]; res.Verdict != "" {
		t.Errorf("%s after skipRest: %+v, want it left to judgeRBAC", verify.CheckDRARBAC, res)
	}
	p.requests.Add(1)
	p.denied["get nodes"] = &denial{what: `get resource "nodes" in the core API group`, count: 1}
	r.set(verify.CheckDRAPrepare, verify.Fail, "claim claim-a: forbidden")
	if res := r.results[verify.CheckDRAPrepare]; res.Verdict != verify.Skip || res.Detail != "see dra.rbac (claim claim-a: forbidden)" {
		t.Errorf("%s after a refusal: %+v, want it skipped: see dra.rbac", verify.CheckDRAPrepare, res)
	}
	r.set(verify.CheckDRAIdempotent, verify.Pass, "fine")
	if res := r.results[verify.CheckDRAIdempotent]; res.Verdict != verify.Pass {
		t.Errorf("a pass after a refusal: %+v", res)
	}
	r.judgeRBAC()
	if res := r.results[verify.CheckDRARBAC]; res.Verdict != verify.Fail || !strings.Contains(res.Detail, `get resource "nodes"`) {
		t.Errorf("%s: %+v, want it failed naming the refusal", verify.CheckDRARBAC, res)
	}
}

// TestRBACVerdictPasses: a driver forbidden nothing passes; one that asked
// the API server nothing is not judged.
func TestRBACVerdictPasses(t *testing.T) {
	t.Parallel()
	p := &apiProxy{denied: map[string]*denial{}}
	if _, _, err := p.rbacVerdict("x"); err == nil {
		t.Error("no requests: no error")
	}
	p.requests.Add(3)
	if pass, detail, err := p.rbacVerdict("x"); !pass || err != nil || !strings.Contains(detail, "3 requests") {
		t.Errorf("rbacVerdict: %v, %q, %v; want a pass", pass, detail, err)
	}
}
