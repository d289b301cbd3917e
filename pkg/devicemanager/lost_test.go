package devicemanager

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

// TestLostCheckpointHoldsResourcesBack: with an unreadable checkpoint, a
// new pod asking for a resource that pods from before the restart ask for
// is refused (the kubelet would hand it their devices) until those pods
// are gone; other resources are admitted as usual.
func TestLostCheckpointHoldsResourcesBack(t *testing.T) {
	dir := testdir.Short(t, "dm")
	if err := os.MkdirAll(PluginDir(dir), 0o750); err != nil {
		t.Fatal(err)
	}
	cpPath := PluginDir(dir) + "/" + checkpoint.FileName
	if err := os.WriteFile(cpPath, []byte(`{"Data":"garbage","Checksum":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m := startManager(t, Config{Root: dir})
	if !m.CheckpointLost() {
		t.Fatal("CheckpointLost() = false with a corrupt checkpoint")
	}
	old := pod("old", c("app", 1)).build()
	m.HoldUnknown([]*corev1Pod{old})

	const other = "example.com/other"
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a", "b"))
	p.register(t, m.SocketPath())
	q := newStub(t, PluginDir(dir), other, "other.sock", nil, devs("x"))
	q.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 && allocatable(m, other) == 1 })

	_, err := m.Admit(context.Background(), pod("new", c("app", 1)).build())
	if !errors.Is(err, ErrUnknownHolders) || !strings.Contains(err.Error(), "default/old") {
		t.Fatalf("Admit of a new pod asking for %s: %v; want it refused naming default/old", res, err)
	}
	var ae *AdmissionError
	if !errors.As(err, &ae) || ae.Reason != ReasonUnexpectedAdmissionError {
		t.Fatalf("error %#v is not an UnexpectedAdmissionError", err)
	}
	if len(p.Calls()) != 0 {
		t.Fatalf("plugin was called for a refused pod: %v", p.Calls())
	}
	// A request of res that the scheduler gave through DRA takes no
	// device of the plugin's: nothing to hold back.
	dra := pod("dra", c("app", 1)).build()
	dra.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{
		ResourceClaimName: "dra-extended-resources",
		RequestMappings:   []corev1.ContainerExtendedResourceRequest{{ContainerName: "app", ResourceName: res, RequestName: "container-0-request-0"}},
	}
	if _, err := m.Admit(context.Background(), dra); err != nil {
		t.Fatalf("Admit of a pod whose %s is DRA-backed: %v", res, err)
	}
	unrelated := pod("unrelated", ctr{name: "app", req: map[string]int64{other: 1}})
	if _, err := m.Admit(context.Background(), unrelated.build()); err != nil {
		t.Fatalf("Admit of a pod asking only for %s: %v", other, err)
	}

	m.RemovePod(old.UID)
	if _, err := m.Admit(context.Background(), pod("new", c("app", 1)).build()); err != nil {
		t.Fatalf("Admit after the old pod is gone: %v", err)
	}
}

// TestDuplicateCheckpointEntriesLeakNothing: a damaged checkpoint that
// lists the same pod, container and resource twice is restored with the
// first entry only, so removing the pod frees every device.
func TestDuplicateCheckpointEntriesLeakNothing(t *testing.T) {
	dir := testdir.Short(t, "dm")
	if err := os.MkdirAll(PluginDir(dir), 0o750); err != nil {
		t.Fatal(err)
	}
	cp := checkpoint.Checkpoint{
		Entries: []checkpoint.PodDevicesEntry{
			{PodUID: "p1", ContainerName: "app", ResourceName: res, DeviceIDs: checkpoint.DevicesPerNUMA{-1: {"a"}}},
			{PodUID: "p1", ContainerName: "app", ResourceName: res, DeviceIDs: checkpoint.DevicesPerNUMA{-1: {"b"}}},
		},
		Registered: map[string][]string{res: {"a", "b"}},
	}
	if err := checkpoint.Write(PluginDir(dir)+"/"+checkpoint.FileName, cp); err != nil {
		t.Fatal(err)
	}
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("a", "b"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 })
	if got := m.Resources()[0].InUse; got != 1 {
		t.Fatalf("%d devices in use after the restore, want 1 (the first entry's)", got)
	}
	m.RemovePod("p1")
	if got := m.Resources()[0].InUse; got != 0 {
		t.Fatalf("%d devices still in use after removing the pod, want 0", got)
	}
	if _, err := m.Admit(context.Background(), pod("p2", c("app", 2)).build()); err != nil {
		t.Fatalf("Admit of both devices after the pod left: %v", err)
	}
}
