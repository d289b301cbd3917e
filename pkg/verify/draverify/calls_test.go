package draverify

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/dpkit/dpkit/pkg/verify"
)

func claimOn(name, pool, device string) *resourcev1.ResourceClaim {
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Status: resourcev1.ResourceClaimStatus{Allocation: &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{
			Results: []resourcev1.DeviceRequestAllocationResult{{Request: "req", Driver: "d.example.com", Pool: pool, Device: device}},
		}}},
	}
}

// A NodePrepareResources answer for several claims is judged claim by
// claim, by UID, as the kubelet reads it.
func TestPreparedProblems(t *testing.T) {
	t.Parallel()
	a, b := claimOn("a", "pool", "dev-0"), claimOn("b", "pool", "dev-1")
	ok := func(pool, device string) *drav1.NodePrepareResourceResponse {
		return &drav1.NodePrepareResourceResponse{Devices: []*drav1.Device{{PoolName: pool, DeviceName: device, RequestNames: []string{"req"}}}}
	}
	tests := []struct {
		name   string
		claims map[string]*drav1.NodePrepareResourceResponse
		want   []string // in the problems, in order; none: no problem
	}{
		{"every claim answered", map[string]*drav1.NodePrepareResourceResponse{"uid-a": ok("pool", "dev-0"), "uid-b": ok("pool", "dev-1")}, nil},
		{"a result missing", map[string]*drav1.NodePrepareResourceResponse{"uid-a": ok("pool", "dev-0")}, []string{"no result for b (UID uid-b)"}},
		{"keyed by name", map[string]*drav1.NodePrepareResourceResponse{"a": ok("pool", "dev-0"), "b": ok("pool", "dev-1")}, []string{"no result for a", "no result for b", "2 result(s) for claims not asked for"}},
		{"a claim's error", map[string]*drav1.NodePrepareResourceResponse{"uid-a": {Error: "broken"}, "uid-b": ok("pool", "dev-1")}, []string{"a (device pool/dev-0): broken"}},
		{"another device", map[string]*drav1.NodePrepareResourceResponse{"uid-a": ok("pool", "dev-1"), "uid-b": ok("pool", "dev-1")}, []string{"a: the result names", "not the allocated device pool/dev-0"}},
		{"another pool", map[string]*drav1.NodePrepareResourceResponse{"uid-a": ok("other", "dev-0"), "uid-b": ok("pool", "dev-1")}, []string{"not the allocated device pool/dev-0"}},
		{"a claim not asked for", map[string]*drav1.NodePrepareResourceResponse{"uid-a": ok("pool", "dev-0"), "uid-b": ok("pool", "dev-1"), "uid-c": ok("pool", "dev-2")}, []string{"1 result(s) for claims not asked for"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := strings.Join(preparedProblems(&drav1.NodePrepareResourcesResponse{Claims: tc.claims}, []*resourcev1.ResourceClaim{a, b}), "; ")
			if len(tc.want) == 0 && got != "" {
				t.Fatalf("problems %q, want none", got)
			}
			rest := got
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("problems %q, want %q (in order)", got, tc.want)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

// An Unprepare answer: a result per claim, keyed by UID, without an
// error.
func TestUnpreparedProblems(t *testing.T) {
	t.Parallel()
	a, b := claimOn("a", "pool", "dev-0"), claimOn("b", "pool", "dev-1")
	resp := &drav1.NodeUnprepareResourcesResponse{Claims: map[string]*drav1.NodeUnprepareResourceResponse{"uid-a": {}, "uid-b": {}}}
	if got := unpreparedProblems(resp, []*resourcev1.ResourceClaim{a, b}); len(got) != 0 {
		t.Errorf("problems %q, want none", got)
	}
	resp.Claims["uid-a"].Error = "broken"
	delete(resp.Claims, "uid-b")
	got := strings.Join(unpreparedProblems(resp, []*resourcev1.ResourceClaim{a, b}), "; ")
	if want := "a: broken; no result for b (UID uid-b)"; got != want {
		t.Errorf("problems %q, want %q", got, want)
	}
}

// Calls made at once: a refused one fails, naming it; one that ran out
// of time is dra.prepare.timeout's and skips.
func TestJudgeConcurrent(t *testing.T) {
	t.Parallel()
	timedOut := fmt.Errorf("NodePrepareResources(c) %w after 1s", errTimedOut)
	tests := []struct {
		name    string
		errs    []error
		verdict verify.Verdict
		detail  string
	}{
		{"all answered", []error{nil, nil, nil}, "", ""},
		{"one refused", []error{nil, errors.New("busy"), nil}, verify.Fail, "1 of 3 failed: call-1: busy"},
		{"one timed out", []error{errors.New("busy"), timedOut, nil}, verify.Skip, "timed out"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls []timedCall
			for i, err := range tc.errs {
				calls = append(calls, timedCall{what: fmt.Sprintf("call-%d", i), err: err})
			}
			v, detail := judgeConcurrent(calls)
			if v != tc.verdict || !strings.Contains(detail, tc.detail) {
				t.Errorf("judgeConcurrent = %q, %q; want %q with %q", v, detail, tc.verdict, tc.detail)
			}
		})
	}
}
