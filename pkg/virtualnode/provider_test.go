package virtualnode

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/backend/sim"
)

// startProvider runs a device host on root and a provider (no backend)
// keeping its pods in the host's store, until the test ends.
func startProvider(t *testing.T, root string) (context.Context, *devicehost.Host, *provider) {
	t.Helper()
	host, err := devicehost.New(devicehost.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	p := newProvider(slog.New(slog.DiscardHandler), host)
	ctx, cancel := context.WithCancel(context.Background())
	if err := host.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); host.Stop() })
	return ctx, host, p
}

// TestCreatePodRejected checks what a pod the device manager rejects gets,
// the kubelet's rejectPod: phase Failed, the admission reason, its message
// after "Pod was rejected: ", the QoS class kept, and a Warning event with
// the reason and message.
func TestCreatePodRejected(t *testing.T) {
	root := testdir.Short(t, "vnp")
	ctx, host, p := startProvider(t, root)
	rec := record.NewFakeRecorder(10)
	p.recorder = rec
	var notified []*corev1.Pod
	p.notify = func(pod *corev1.Pod) { notified = append(notified, pod) }
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
	if got, ok := p.pods.GetPodByName("ns", "too-many"); !ok || got.Status.Phase != corev1.PodFailed {
		t.Errorf("provider's pod %v (known %v), want it Failed", got, ok)
	}
	if active := p.pods.GetActivePods(); len(active) != 0 {
		t.Errorf("active pods %v, want none", active)
	}
}

// TestCreatePodHostProcessSecurity checks a node that runs containers as
// host processes refuses a pod asking for a security field it cannot
// apply as it refuses any pod at admission: phase Failed, reason
// SecurityContext, the message naming the field, a Warning event, and
// the backend never gets the pod. The same pod runs on a node with a
// runtime, and a pod without such a field on the host-process node.
func TestCreatePodHostProcessSecurity(t *testing.T) {
	ctx, _, p := startProvider(t, testdir.Short(t, "vnp"))
	sb := sim.New(sim.Config{Config: backend.Config{Notify: p.backendNotify}})
	p.be = sb
	rec := record.NewFakeRecorder(10)
	p.recorder = rec
	p.hostProcesses = true
	newPod := func(name string, sc *corev1.SecurityContext) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{
				{Name: "side"}, {Name: "app", SecurityContext: sc},
			}},
			Status: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBestEffort},
		}
	}
	seccomp := &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}

	if err := p.CreatePod(ctx, newPod("restricted", seccomp)); err != nil {
		t.Fatalf("CreatePod: %v", err)
	}
	const msg = "Cannot enforce spec.containers[1].securityContext.seccompProfile (RuntimeDefault): this node runs containers as host processes; run the pod on a node with a container runtime (dpkit node --backend cri) or remove the field"
	got, err := p.GetPod(ctx, "ns", "restricted")
	if err != nil {
		t.Fatal(err)
	}
	st := got.Status
	want := corev1.PodStatus{Phase: corev1.PodFailed, Reason: reasonSecurityContext, Message: "Pod was rejected: " + msg, QOSClass: corev1.PodQOSBestEffort}
	if st.Phase != want.Phase || st.Reason != want.Reason || st.Message != want.Message || st.QOSClass != want.QOSClass || len(st.ContainerStatuses) != 0 {
		t.Errorf("refused pod status %+v, want %+v", st, want)
	}
	select {
	case ev := <-rec.Events:
		if ev != "Warning SecurityContext "+msg {
			t.Errorf("event %q, want the Warning SecurityContext with the message", ev)
		}
	default:
		t.Error("no event recorded for the refused pod")
	}
	if pods := sb.Pods(); len(pods) != 0 {
		t.Errorf("the backend got %d pods, want none", len(pods))
	}
	if active := p.pods.GetActivePods(); len(active) != 0 {
		t.Errorf("%d active pods, want none", len(active))
	}

	// Without such a field the pod runs on the host-process node.
	if err := p.CreatePod(ctx, newPod("plain", &corev1.SecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}})); err != nil {
		t.Fatal(err)
	}
	// With a runtime, the same restricted pod reaches the backend.
	p.hostProcesses = false
	if err := p.CreatePod(ctx, newPod("restricted-cri", seccomp)); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain", "restricted-cri"} {
		got, err := p.GetPod(ctx, "ns", name)
		if err != nil {
			t.Fatalf("pod %s: %v", name, err)
		}
		if got.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s %s (%s), want it Running", name, got.Status.Phase, got.Status.Message)
		}
	}
	if pods := sb.Pods(); len(pods) != 2 {
		t.Errorf("the backend got %d pods, want the 2 admitted", len(pods))
	}
}

// TestPodReplacedBySameName checks a pod deleted from the API server and
// created again under the same name runs again: DeletePod for a pod the
// API server no longer has forgets it even though it was being deleted,
// and a pod whose UID differs from the one the node knows under that name
// is created (by CreatePod or UpdatePod), not taken for an update.
func TestPodReplacedBySameName(t *testing.T) {
	ctx, _, p := startProvider(t, testdir.Short(t, "vnp"))
	p.be = sim.New(sim.Config{Config: backend.Config{Notify: p.backendNotify}})
	apiUID := types.UID("")
	p.api.Store(&apiView{inAPI: func(_, _ string, uid types.UID) bool { return uid == apiUID }})
	newPod := func(uid types.UID) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: uid},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{Name: "app"}}},
		}
	}
	phase := func() (types.UID, corev1.PodPhase) {
		got, err := p.GetPod(ctx, "ns", "web")
		if err != nil {
			return "", ""
		}
		return got.UID, got.Status.Phase
	}

	// Created, running, deleted gracefully while the API server has it.
	first := newPod("uid-1")
	apiUID = first.UID
	if err := p.CreatePod(ctx, first); err != nil {
		t.Fatal(err)
	}
	if uid, ph := phase(); uid != "uid-1" || ph != corev1.PodRunning {
		t.Fatalf("after CreatePod: %s %s, want uid-1 Running", uid, ph)
	}
	deleting := first.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	grace := int64(0)
	deleting.DeletionGracePeriodSeconds = &grace
	if err := p.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	if uid, ph := phase(); uid != "uid-1" || (ph != corev1.PodSucceeded && ph != corev1.PodFailed) {
		t.Fatalf("after a graceful DeletePod: %s %s, want uid-1 terminated", uid, ph)
	}
	// Gone from the API server: the last state it had (deletionTimestamp
	// set) is what DeletePod gets; the pod is forgotten.
	apiUID = ""
	if err := p.DeletePod(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	if uid, _ := phase(); uid != "" {
		t.Fatalf("pod %s still known after it left the API server", uid)
	}

	// Created again under the same name: runs.
	second := newPod("uid-2")
	apiUID = second.UID
	if err := p.CreatePod(ctx, second); err != nil {
		t.Fatal(err)
	}
	if uid, ph := phase(); uid != "uid-2" || ph != corev1.PodRunning {
		t.Fatalf("re-created pod: %s %s, want uid-2 Running", uid, ph)
	}

	// Replaced before the node saw the deletion: the new pod arrives as
	// an update of the old name.
	third := newPod("uid-3")
	apiUID = third.UID
	if err := p.UpdatePod(ctx, third); err != nil {
		t.Fatal(err)
	}
	if uid, ph := phase(); uid != "uid-3" || ph != corev1.PodRunning {
		t.Fatalf("pod replaced before its deletion was seen: %s %s, want uid-3 Running", uid, ph)
	}
	if len(p.be.Pods()) != 1 {
		t.Errorf("backend runs %d pods, want only the replacement", len(p.be.Pods()))
	}
}
