package virtualnode

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
)

// TestCreatePodRejected checks what a pod the device manager rejects gets,
// the kubelet's rejectPod: phase Failed, the admission reason, its message
// after "Pod was rejected: ", the QoS class kept, and a Warning event with
// the reason and message.
func TestCreatePodRejected(t *testing.T) {
	root, err := os.MkdirTemp("", "vnp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	host, err := devicehost.New(devicehost.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(slog.New(slog.DiscardHandler), host.Manager)
	rec := record.NewFakeRecorder(10)
	p.recorder = rec
	var notified []*corev1.Pod
	p.notify = func(pod *corev1.Pod) { notified = append(notified, pod) }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := host.Start(ctx, p, nil); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); host.Stop() }()
	changes, unsubscribe := host.Manager.Subscribe()
	defer unsubscribe()
	cfg := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo", Count: 1}}}
	cfg.Default()
	resources, err := fake.New(cfg, plugins.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := deviceplugin.NewServer(deviceplugin.Config{PluginDir: filepath.Join(root, "device-plugins")}, resources...)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	pdone := make(chan error, 1)
	go func() { pdone <- srv.Run(pctx) }()
	defer func() { pcancel(); <-pdone }()
	timeout := time.After(10 * time.Second)
	for {
		if _, alloc := host.Manager.Capacity(); alloc["example.com/foo"] == 1 {
			break
		}
		select {
		case <-changes:
		case <-timeout:
			t.Fatalf("example.com/foo never reached 1 allocatable: %v", host.Manager.Resources())
		}
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "too-many", Namespace: "ns", UID: "uid-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:      "app",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"example.com/foo": resource.MustParse("2")}},
		}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBestEffort},
	}
	// No backend: a rejected pod must never reach it.
	if err := p.CreatePod(ctx, pod); err != nil {
		t.Fatalf("CreatePod: %v", err)
	}
	const msg = "Allocate failed due to requested number of devices unavailable for example.com/foo. Requested: 2, Available: 1, which is unexpected"
	if len(notified) != 1 {
		t.Fatalf("%d status notifications, want 1", len(notified))
	}
	st := notified[0].Status
	want := corev1.PodStatus{Phase: corev1.PodFailed, Reason: "UnexpectedAdmissionError", Message: "Pod was rejected: " + msg, QOSClass: corev1.PodQOSBestEffort}
	if st.Phase != want.Phase || st.Reason != want.Reason || st.Message != want.Message || st.QOSClass != want.QOSClass || len(st.ContainerStatuses) != 0 {
		t.Errorf("rejected pod status %+v, want %+v", st, want)
	}
	select {
	case ev := <-rec.Events:
		if ev != "Warning UnexpectedAdmissionError "+msg {
			t.Errorf("event %q, want the Warning UnexpectedAdmissionError with the admission message", ev)
		}
	default:
		t.Error("no event recorded for the rejected pod")
	}
	if got, ok := p.GetPodByName("ns", "too-many"); !ok || got.Status.Phase != corev1.PodFailed {
		t.Errorf("provider's pod %v (known %v), want it Failed", got, ok)
	}
	if active := p.GetActivePods(); len(active) != 0 {
		t.Errorf("active pods %v, want none", active)
	}
}
