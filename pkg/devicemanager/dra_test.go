package devicemanager

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/internal/testdir"
)

// TestDRABackedExtendedResourceSkipped: a container whose request of an
// extended resource the scheduler gave through DRA
// (status.extendedResourceClaimStatus maps it) gets no device from the
// device manager, even when a device plugin serves the name, as the
// kubelet's isDRAExtendedResource; the same name asked by another
// container that the mapping does not name is allocated.
func TestDRABackedExtendedResourceSkipped(t *testing.T) {
	dir := testdir.Short(t, "dm")
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 })

	pod := makePod("p1", c("dra", 1), c("plugin", 1))
	pod.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "p1-extended-resources-abcde",
		RequestMappings:   []corev1.ContainerExtendedResourceRequest{{ContainerName: "dra", ResourceName: res, RequestName: "container-0-request-0"}},
	}
	pa, err := m.Admit(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	if ids := containerIDs(pa, "dra", res); len(ids) != 0 {
		t.Fatalf("container dra got devices %v of its DRA-backed %s, want none", ids, res)
	}
	if ids := containerIDs(pa, "plugin", res); len(ids) != 1 {
		t.Fatalf("container plugin got devices %v, want one", ids)
	}
	if got := m.Resources()[0].InUse; got != 1 {
		t.Fatalf("InUse = %d, want 1 (only the device plugin request)", got)
	}
	allocs := 0
	for _, call := range p.Calls() {
		if strings.HasPrefix(call, "Allocate:") {
			allocs++
		}
	}
	if allocs != 1 {
		t.Fatalf("plugin calls %v, want one Allocate", p.Calls())
	}
}

func TestIsDRAExtendedResource(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{Status: corev1.PodStatus{ExtendedResourceClaimStatus: &corev1.PodExtendedResourceClaimStatus{
		RequestMappings: []corev1.ContainerExtendedResourceRequest{{ContainerName: "a", ResourceName: "example.com/x"}},
	}}}
	for _, tc := range []struct {
		name, container, rn string
		pod                 *corev1.Pod
		want                bool
	}{
		{"mapped", "a", "example.com/x", pod, true},
		{"other container", "b", "example.com/x", pod, false},
		{"other resource", "a", "example.com/y", pod, false},
		{"no claim status", "a", "example.com/x", &corev1.Pod{}, false},
	} {
		if got := IsDRAExtendedResource(tc.pod, tc.container, tc.rn); got != tc.want {
			t.Errorf("%s: IsDRAExtendedResource = %v, want %v", tc.name, got, tc.want)
		}
	}
}
