package extresource

import (
	"encoding/json"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestEscapePointer(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"example.com/dongle": "example.com~1dongle",
		"a~b/c":              "a~0b~1c",
		"plain":              "plain",
		"~1":                 "~01",
	} {
		if got := EscapePointer(in); got != want {
			t.Errorf("EscapePointer(%q) = %q, want %q", in, got, want)
		}
	}
}

func list(kv ...string) corev1.ResourceList {
	l := corev1.ResourceList{}
	for i := 0; i < len(kv); i += 2 {
		l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return l
}

func TestDiff(t *testing.T) {
	t.Parallel()
	const d = "example.com/dongle"
	tests := []struct {
		name        string
		status      corev1.NodeStatus
		set         corev1.ResourceList
		remove      []corev1.ResourceName
		allocatable bool
		want        string // the patch as JSON
		wantStatus  corev1.NodeStatus
	}{
		{
			name:        "add to existing maps",
			status:      corev1.NodeStatus{Capacity: list("cpu", "4"), Allocatable: list("cpu", "4")},
			set:         list(d, "4"),
			allocatable: true,
			want:        `[{"op":"add","path":"/status/capacity/example.com~1dongle","value":"4"},{"op":"add","path":"/status/allocatable/example.com~1dongle","value":"4"}]`,
			wantStatus:  corev1.NodeStatus{Capacity: list("cpu", "4", d, "4"), Allocatable: list("cpu", "4", d, "4")},
		},
		{
			name:       "capacity only",
			status:     corev1.NodeStatus{Capacity: list("cpu", "4"), Allocatable: list("cpu", "4")},
			set:        list(d, "4"),
			want:       `[{"op":"add","path":"/status/capacity/example.com~1dongle","value":"4"}]`,
			wantStatus: corev1.NodeStatus{Capacity: list("cpu", "4", d, "4"), Allocatable: list("cpu", "4")},
		},
		{
			name:        "maps absent",
			set:         list(d, "4"),
			allocatable: true,
			want:        `[{"op":"add","path":"/status/capacity","value":{"example.com/dongle":"4"}},{"op":"add","path":"/status/allocatable","value":{"example.com/dongle":"4"}}]`,
			wantStatus:  corev1.NodeStatus{Capacity: list(d, "4"), Allocatable: list(d, "4")},
		},
		{
			name:        "already there",
			status:      corev1.NodeStatus{Capacity: list(d, "4"), Allocatable: list(d, "4")},
			set:         list(d, "4"),
			allocatable: true,
			want:        `null`,
			wantStatus:  corev1.NodeStatus{Capacity: list(d, "4"), Allocatable: list(d, "4")},
		},
		{
			name:        "same amount written differently",
			status:      corev1.NodeStatus{Capacity: list(d, "2000"), Allocatable: list(d, "2000")},
			set:         list(d, "2k"),
			allocatable: true,
			want:        `null`,
			wantStatus:  corev1.NodeStatus{Capacity: list(d, "2000"), Allocatable: list(d, "2000")},
		},
		{
			name:        "change amount",
			status:      corev1.NodeStatus{Capacity: list(d, "4"), Allocatable: list(d, "3")},
			set:         list(d, "6"),
			allocatable: true,
			want:        `[{"op":"add","path":"/status/capacity/example.com~1dongle","value":"6"},{"op":"add","path":"/status/allocatable/example.com~1dongle","value":"6"}]`,
			wantStatus:  corev1.NodeStatus{Capacity: list(d, "6"), Allocatable: list(d, "6")},
		},
		{
			name:       "remove from both even when only capacity is written",
			status:     corev1.NodeStatus{Capacity: list("cpu", "1", d, "4"), Allocatable: list("cpu", "1", d, "4")},
			remove:     []corev1.ResourceName{d},
			want:       `[{"op":"remove","path":"/status/capacity/example.com~1dongle"},{"op":"remove","path":"/status/allocatable/example.com~1dongle"}]`,
			wantStatus: corev1.NodeStatus{Capacity: list("cpu", "1"), Allocatable: list("cpu", "1")},
		},
		{
			name:       "remove what is not there",
			status:     corev1.NodeStatus{Capacity: list("cpu", "1")},
			remove:     []corev1.ResourceName{d},
			want:       `null`,
			wantStatus: corev1.NodeStatus{Capacity: list("cpu", "1")},
		},
		{
			name:        "set wins over remove",
			status:      corev1.NodeStatus{Capacity: list(d, "1"), Allocatable: list(d, "1")},
			set:         list(d, "1"),
			remove:      []corev1.ResourceName{d},
			allocatable: true,
			want:        `null`,
			wantStatus:  corev1.NodeStatus{Capacity: list(d, "1"), Allocatable: list(d, "1")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			node := &corev1.Node{Status: tt.status}
			patch, change := Diff(node, tt.set, tt.remove, tt.allocatable)
			got, err := json.Marshal(patch)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("patch\n got %s\nwant %s", got, tt.want)
			}
			if change.Empty() != (len(patch) == 0) {
				t.Errorf("change %+v disagrees with patch %s", change, got)
			}
			if len(patch) == 0 {
				return
			}
			// Apply the patch as the apiserver would and compare.
			doc, err := json.Marshal(node)
			if err != nil {
				t.Fatal(err)
			}
			p, err := jsonpatch.DecodePatch(patch.JSON())
			if err != nil {
				t.Fatal(err)
			}
			out, err := p.Apply(doc)
			if err != nil {
				t.Fatalf("apply %s to %s: %v", got, doc, err)
			}
			var patched corev1.Node
			if err := json.Unmarshal(out, &patched); err != nil {
				t.Fatal(err)
			}
			for field, pair := range map[string][2]corev1.ResourceList{
				"capacity":    {patched.Status.Capacity, tt.wantStatus.Capacity},
				"allocatable": {patched.Status.Allocatable, tt.wantStatus.Allocatable},
			} {
				if !equalLists(pair[0], pair[1]) {
					t.Errorf("%s after patch = %v, want %v", field, pair[0], pair[1])
				}
			}
			// A second diff against the result is empty: the patch converges.
			if again, _ := Diff(&patched, tt.set, tt.remove, tt.allocatable); len(again) != 0 {
				t.Errorf("second diff not empty: %s", again.JSON())
			}
		})
	}
}

func equalLists(a, b corev1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for n, q := range a {
		o, ok := b[n]
		if !ok || q.Cmp(o) != 0 {
			return false
		}
	}
	return true
}
