package draverify

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"
)

// The kubelet hands a container the CDI devices of a device answered
// under no request name or under exactly the request it names, the main
// name of a prioritized list's request.
func TestRequestNameProblem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		names []string
		ok    bool
	}{
		{nil, true},
		{[]string{"req"}, true},
		{[]string{"req/small", "req"}, true},
		{[]string{"req/small"}, false},
		{[]string{"small"}, false},
		{[]string{"other"}, false},
	} {
		p := requestNameProblem([]*drav1.Device{{RequestNames: tc.names}}, "req")
		if (p == "") != tc.ok {
			t.Errorf("request names %q: problem %q, want ok=%v", tc.names, p, tc.ok)
		}
	}
}

func capacity(value, def string, rng *resourcev1.CapacityRequestPolicyRange) resourcev1.DeviceCapacity {
	c := resourcev1.DeviceCapacity{Value: resource.MustParse(value)}
	if def != "" || rng != nil {
		c.RequestPolicy = &resourcev1.CapacityRequestPolicy{ValidRange: rng}
		if def != "" {
			c.RequestPolicy.Default = ptr.To(resource.MustParse(def))
		}
	}
	return c
}

// A request policy's default is judged where the API server does not:
// alone, or with a validRange without max.
func TestPolicyAndConsumption(t *testing.T) {
	t.Parallel()
	step := &resourcev1.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("1Gi")), Step: ptr.To(resource.MustParse("1Gi"))}
	for _, tc := range []struct {
		name       string
		cap        resourcev1.DeviceCapacity
		problem    string // in the problem; "" for none
		two, fitOK bool
	}{
		{"default in range", capacity("10Gi", "1Gi", step), "", true, true},
		{"default above the value, range without max", capacity("10Gi", "20Gi", step), "above the capacity's value 10Gi", false, false},
		{"default alone above the value", capacity("10Gi", "11Gi", nil), "above the capacity's value", false, false},
		{"negative default", capacity("10Gi", "-1", nil), "is negative", false, false},
		{"no policy: a share takes it all", capacity("10Gi", "", nil), "", false, true},
		{"default of more than half", capacity("10Gi", "6Gi", nil), "", false, true},
	} {
		s := shareable{"pool", resourcev1.Device{Name: "dev", AllowMultipleAllocations: ptr.To(true),
			Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"bw": tc.cap}}}
		p := strings.Join(policyProblems(s), "; ")
		if (tc.problem == "") != (p == "") || !strings.Contains(p, tc.problem) {
			t.Errorf("%s: problems %q, want %q", tc.name, p, tc.problem)
		}
		consumed, two, ok := consumption(s)
		if two != tc.two || ok != tc.fitOK {
			t.Errorf("%s: consumption %v: two fit %v, one fits %v; want %v, %v", tc.name, consumed, two, ok, tc.two, tc.fitOK)
		}
	}
}

// The devices that allow multiple allocations are found in the newest
// generation of their pool, for the node only.
func TestMultiAllocatable(t *testing.T) {
	t.Parallel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	multi := resourcev1.Device{Name: "shared", AllowMultipleAllocations: ptr.To(true)}
	sl := []resourcev1.ResourceSlice{
		pslice("old", "p", 1, "n", multi),
		pslice("new", "p", 2, "n", resourcev1.Device{Name: "plain"}, multi),
		pslice("other", "q", 1, "m", multi),
	}
	got := multiAllocatable(sl, node)
	if len(got) != 1 || got[0].pool != "p" || got[0].dev.Name != "shared" {
		t.Errorf("multiAllocatable %+v, want p/shared only", got)
	}
}

func pslice(name, pool string, gen int64, node string, devs ...resourcev1.Device) resourcev1.ResourceSlice {
	return resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.ResourceSliceSpec{
		Driver: "d", NodeName: ptr.To(node), Pool: resourcev1.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: 1}, Devices: devs,
	}}
}

func counters(name string, kv ...string) resourcev1.CounterSet {
	cs := resourcev1.CounterSet{Name: name, Counters: map[string]resourcev1.Counter{}}
	for i := 0; i < len(kv); i += 2 {
		cs.Counters[kv[i]] = resourcev1.Counter{Value: resource.MustParse(kv[i+1])}
	}
	return cs
}

func consumer(name, set string, kv ...string) resourcev1.Device {
	cs := counters(set, kv...)
	return resourcev1.Device{Name: name, ConsumesCounters: []resourcev1.DeviceCounterConsumption{{CounterSet: set, Counters: cs.Counters}}}
}

// What the scheduler takes a pool as invalid for, or never allocates,
// across the pool's slices of its newest generation.
func TestCounterProblems(t *testing.T) {
	t.Parallel()
	withCounters := func(name string, gen int64, sets ...resourcev1.CounterSet) resourcev1.ResourceSlice {
		s := pslice(name, "p", gen, "n")
		s.Spec.SharedCounters = sets
		return s
	}
	for _, tc := range []struct {
		name    string
		sl      []resourcev1.ResourceSlice
		problem string
	}{
		{"fits", []resourcev1.ResourceSlice{withCounters("c", 1, counters("chip", "mem", "8Gi")), pslice("d", "p", 1, "n", consumer("a", "chip", "mem", "4Gi"), consumer("b", "chip", "mem", "8Gi"))}, ""},
		{"no such set", []resourcev1.ResourceSlice{withCounters("c", 1, counters("chip", "mem", "8Gi")), pslice("d", "p", 1, "n", consumer("a", "chip-9", "mem", "4Gi"))}, "consumes counter set chip-9, which pool p does not define"},
		{"no such counter", []resourcev1.ResourceSlice{withCounters("c", 1, counters("chip", "mem", "8Gi")), pslice("d", "p", 1, "n", consumer("a", "chip", "cores", "1"))}, "consumes counter cores of set chip"},
		{"set twice", []resourcev1.ResourceSlice{withCounters("c1", 1, counters("chip", "mem", "8Gi")), withCounters("c2", 1, counters("chip", "mem", "8Gi"))}, "defines counter set chip in c1 and in c2"},
		{"more than the set holds", []resourcev1.ResourceSlice{withCounters("c", 1, counters("chip", "mem", "8Gi")), pslice("d", "p", 1, "n", consumer("a", "chip", "mem", "9Gi"))}, "consumes 9Gi of counter chip/mem, which holds 8Gi"},
		{"counters of an older generation", []resourcev1.ResourceSlice{withCounters("c", 1, counters("chip", "mem", "8Gi")), pslice("d", "p", 2, "n", consumer("a", "chip", "mem", "4Gi"))}, "does not define in generation 2"},
	} {
		pools := newestPools(tc.sl)
		pr, _, _ := counterProblems("p", pools["p"])
		p := strings.Join(pr, "; ")
		if (tc.problem == "") != (p == "") || !strings.Contains(p, tc.problem) {
			t.Errorf("%s: problems %q, want %q", tc.name, p, tc.problem)
		}
	}
}

// The driver's entries in status.devices are for its results of the
// allocation, with a hardware address that is one; other drivers'
// entries are theirs.
func TestStatusProblems(t *testing.T) {
	t.Parallel()
	share := types.UID("6f1b9c3e-0000-4000-8000-000000000001")
	claim := func(entries ...resourcev1.AllocatedDeviceStatus) *resourcev1.ResourceClaim {
		return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Status: resourcev1.ResourceClaimStatus{
			Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
				{Request: "req", Driver: "d", Pool: "p", Device: "dev-0"},
				{Request: "req", Driver: "d", Pool: "p", Device: "shared", ShareID: &share},
			}}},
			Devices: entries,
		}}
	}
	mac := func(a string) *resourcev1.NetworkDeviceData { return &resourcev1.NetworkDeviceData{HardwareAddress: a} }
	for _, tc := range []struct {
		name    string
		entries []resourcev1.AllocatedDeviceStatus
		n       int
		problem string
	}{
		{"none", nil, 0, ""},
		{"allocated", []resourcev1.AllocatedDeviceStatus{{Driver: "d", Pool: "p", Device: "dev-0", NetworkData: mac("02:00:00:00:00:01")}}, 1, ""},
		{"share", []resourcev1.AllocatedDeviceStatus{{Driver: "d", Pool: "p", Device: "shared", ShareID: ptr.To(string(share))}}, 1, ""},
		{"share missing", []resourcev1.AllocatedDeviceStatus{{Driver: "d", Pool: "p", Device: "shared"}}, 1, "for no result"},
		{"not allocated", []resourcev1.AllocatedDeviceStatus{{Driver: "d", Pool: "p", Device: "dev-1"}}, 1, "for no result"},
		{"another driver's", []resourcev1.AllocatedDeviceStatus{{Driver: "other", Pool: "p", Device: "dev-9"}}, 0, ""},
		{"no hardware address", []resourcev1.AllocatedDeviceStatus{{Driver: "d", Pool: "p", Device: "dev-0", NetworkData: mac("eth0")}}, 1, "not a hardware address"},
	} {
		pr, n := statusProblems(claim(tc.entries...), "d")
		p := strings.Join(pr, "; ")
		if n != tc.n || (tc.problem == "") != (p == "") || !strings.Contains(p, tc.problem) {
			t.Errorf("%s: %d entries, problems %q; want %d, %q", tc.name, n, p, tc.n, tc.problem)
		}
	}
}

// The devices health may report are those the driver publishes for the
// node, by pool and name.
func TestUnpublished(t *testing.T) {
	t.Parallel()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
	sl := []resourcev1.ResourceSlice{
		pslice("a", "p", 1, "n", resourcev1.Device{Name: "dev-0"}),
		pslice("b", "q", 1, "n", resourcev1.Device{Name: "dev-1"}),
		pslice("c", "r", 1, "m", resourcev1.Device{Name: "dev-2"}),
	}
	got := unpublished([]string{"p/dev-0", "q/dev-1", "q/dev-0", "r/dev-2", "p/DEV-0"}, publishedKeys(sl, node))
	if want := []string{"p/DEV-0", "q/dev-0", "r/dev-2"}; !slices.Equal(got, want) {
		t.Errorf("unpublished %q, want %q", got, want)
	}
}

// The spec files are judged by the CDI library as a runtime reads them;
// a device two files define is a conflict.
func TestCDISpecFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, version string, devs ...string) {
		type device struct {
			Name           string            `json:"name"`
			Annotations    map[string]string `json:"annotations,omitempty"`
			ContainerEdits map[string]any    `json:"containerEdits"`
		}
		spec := map[string]any{"cdiVersion": version, "kind": "example.com/dev"}
		var ds []device
		for _, d := range devs {
			ds = append(ds, device{Name: d, Annotations: map[string]string{"example.com/claim": name}, ContainerEdits: map[string]any{"env": []string{"X=1"}}})
		}
		spec["devices"] = ds
		data, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a.json", "0.6.0", "claim-a")
	write("b.json", "0.5.0", "claim-b")  // annotations need 0.6.0
	write("c.yaml", "1.1.0", "claim-a")  // claim-a again
	write("ignored.txt", "0.6.0", "zzz") // not read by the CDI cache
	files, problems := validateSpecFiles(dir)
	if files != 3 || len(problems) != 1 || !strings.Contains(problems[0], "b.json") || !strings.Contains(problems[0], "at least v0.6.0") {
		t.Errorf("validateSpecFiles: %d files, problems %q; want 3, b.json needing v0.6.0", files, problems)
	}
	idx := indexCDI(dir)
	c := idx.conflicts()
	if len(c) != 1 || c[0] != "example.com/dev=claim-a in a.json and c.yaml" {
		t.Errorf("conflicts %q, want claim-a in a.json and c.yaml", c)
	}
	// A claim's ID resolves when one file defines it.
	got := idx.unresolved([]string{"example.com/dev=claim-b", "example.com/dev=claim-a", "example.com/dev=gone"})
	if want := []string{"example.com/dev=claim-a (in 2 spec files)", "example.com/dev=gone (in 0 spec files)"}; !slices.Equal(got, want) {
		t.Errorf("unresolved %q, want %q", got, want)
	}
	if got, want := idx.keys(), []string{"example.com/dev=claim-a", "example.com/dev=claim-b"}; !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
}

// The proxy notes the driver's writes of a claim's status that the API
// server refuses as invalid, and hands the driver the body all the same.
func TestNoteRefused(t *testing.T) {
	t.Parallel()
	p := &apiProxy{log: slog.New(slog.DiscardHandler), prefix: "/prefix"}
	invalid := func(method, path string, code int) *http.Response {
		body, _ := json.Marshal(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code),
			Message: `ResourceClaim.resource.k8s.io "c" is invalid: status.devices[0].networkData.ips[0]: Invalid value: "10.0.0.1"`})
		return &http.Response{StatusCode: code, Request: httptest.NewRequest(method, path, nil), Body: io.NopCloser(bytes.NewReader(body))}
	}
	status := "/prefix/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
	for _, resp := range []*http.Response{
		invalid("PUT", status, http.StatusConflict),
		invalid("PUT", "/prefix/apis/resource.k8s.io/v1/resourceslices/s", http.StatusUnprocessableEntity),
		invalid("PUT", "/prefix/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c", http.StatusUnprocessableEntity),
	} {
		p.noteRefused(resp)
	}
	if n, _ := p.refusedWrites(); n != 0 {
		t.Fatalf("%d refusals noted of a conflict, a slice and a claim's spec; want none", n)
	}
	resp := invalid("PATCH", status, http.StatusUnprocessableEntity)
	p.noteRefused(resp)
	p.noteRefused(invalid("PATCH", status, http.StatusUnprocessableEntity))
	n, msgs := p.refusedWrites()
	if n != 2 || len(msgs) != 1 || !strings.Contains(msgs[0], "patch of ResourceClaim ns/c") || !strings.Contains(msgs[0], "networkData.ips[0]") {
		t.Errorf("refusals %d %q, want 2, one message naming the claim and the field", n, msgs)
	}
	if body, err := io.ReadAll(resp.Body); err != nil || !bytes.Contains(body, []byte("networkData.ips[0]")) {
		t.Errorf("the driver's body %q (%v), want the Status", body, err)
	}
}
