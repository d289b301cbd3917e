package devicemanager

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
)

// TestAdmissionWait: after a restart the checkpoint knows the resource
// but no plugin serves it yet. As the kubelet, a pod asking for it is
// refused at once (UnexpectedAdmissionError); with an admission wait the
// pod is held until the plugin has registered and listed its devices,
// then admitted. A resource no plugin ever served is not waited for.
func TestAdmissionWait(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "dmw")
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2", "d3"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 3 })
	m.Stop()
	p.stop()

	// The kubelet's answer: refused, for good.
	m2 := startManager(t, Config{Root: dir})
	var ae *AdmissionError
	if _, err := m2.Admit(context.Background(), makePod("early", c("app", 1))); !errors.As(err, &ae) || ae.Reason != ReasonUnexpectedAdmissionError {
		t.Fatalf("admission before the plugin is back without a wait: %v, want UnexpectedAdmissionError", err)
	}
	m2.Stop()

	m3 := startManager(t, Config{Root: dir, AdmissionWait: time.Hour})
	admitted := make(chan error, 1)
	go func() {
		_, err := m3.Admit(context.Background(), makePod("held", c("app", 2)))
		admitted <- err
	}()
	// Held while the plugin is away: nothing answers until it is back.
	waitFor(t, m3, "the pod held", func() bool { return slices.Equal(m3.HeldPods(), []string{"default/held"}) })
	select {
	case err := <-admitted:
		t.Fatalf("admitted before the plugin registered: %v", err)
	default:
	}
	p2 := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2", "d3"))
	p2.register(t, m3.SocketPath())
	if err := <-admitted; err != nil {
		t.Fatalf("held pod once the plugin is back: %v", err)
	}
	if pa := m3.PodAllocation("held"); pa == nil {
		t.Fatal("held pod has no allocation")
	}
	if held := m3.HeldPods(); len(held) != 0 {
		t.Errorf("still held after admission: %v", held)
	}

	// Never served here: not waited for (an hour's wait would hang
	// the test); the device manager leaves it to whoever advertises it,
	// as the kubelet's.
	other := makePod("other", ctr{name: "app", req: map[string]int64{"example.com/never": 1}})
	if _, err := m3.Admit(context.Background(), other); err != nil {
		t.Fatalf("a resource no plugin ever served: %v", err)
	}
}

// TestAdmissionWaitEnds: a wait that ends admits with what there is, and
// so refuses as the kubelet.
func TestAdmissionWaitEnds(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "dme")
	m := startManager(t, Config{Root: dir})
	p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1"))
	p.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 1 })
	m.Stop()
	p.stop()
	m2 := startManager(t, Config{Root: dir, AdmissionWait: time.Millisecond})
	var ae *AdmissionError
	if _, err := m2.Admit(context.Background(), makePod("p", c("app", 1))); !errors.As(err, &ae) || ae.Reason != ReasonUnexpectedAdmissionError {
		t.Fatalf("after the wait: %v, want UnexpectedAdmissionError", err)
	}
}

// TestAdmissionWaitPluginGoingAway: with an admission wait, an Allocate
// that finds its plugin going away (Unavailable: the plugin is stopping;
// Canceled: the connection to it closed) does not fail the pod: the admission waits for the plugin to be back
// and is tried again. Without the wait it fails, as the kubelet's.
func TestAdmissionWaitPluginGoingAway(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait time.Duration
		code codes.Code // what Allocate fails with
		msg  string
	}{
		{0, codes.Unavailable, "closing transport due to: graceful_stop"},
		{time.Hour, codes.Unavailable, "closing transport due to: graceful_stop"},
		{time.Hour, codes.Canceled, "grpc: the client connection is closing"},
	} {
		wait := tc.wait
		dir := testdir.Short(t, "dmg")
		m := startManager(t, Config{Root: dir, AdmissionWait: wait})
		p := newStub(t, PluginDir(dir), res, "dev.sock", nil, devs("d1", "d2"))
		p.mu.Lock()
		p.allocate = func([]string) (*pluginapi.AllocateResponse, error) {
			// What a plugin in its graceful stop answers; it is then gone.
			go p.stop()
			return nil, status.Error(tc.code, tc.msg)
		}
		p.mu.Unlock()
		p.register(t, m.SocketPath())
		waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 2 })
		admitted := make(chan error, 1)
		go func() {
			_, err := m.Admit(context.Background(), makePod("p", c("app", 1)))
			admitted <- err
		}()
		if wait == 0 {
			var ae *AdmissionError
			if err := <-admitted; !errors.As(err, &ae) || status.Code(err) != tc.code {
				t.Fatalf("without a wait: %v, want the Allocate's Unavailable as an admission error", err)
			}
			continue
		}
		// Held until a plugin serves the resource again.
		waitFor(t, m, "the plugin gone and the pod held", func() bool { return slices.Equal(m.HeldPods(), []string{"default/p"}) })
		p2 := newStub(t, PluginDir(dir), res, "dev2.sock", nil, devs("d1", "d2"))
		p2.register(t, m.SocketPath())
		if err := <-admitted; err != nil {
			t.Fatalf("with a wait, once the plugin is back: %v", err)
		}
	}
}

// TestAdmissionWaitPluginGoneMidAdmission: a plugin that goes away after
// the wait let the admission through and before its resource is
// allocated (here while another resource of the pod is) leaves that
// resource without healthy devices; with an admission wait the pod is
// held again rather than refused, and admitted once the plugin is back.
func TestAdmissionWaitPluginGoneMidAdmission(t *testing.T) {
	t.Parallel()
	const other = "example.com/other"
	dir := testdir.Short(t, "dmm")
	m := startManager(t, Config{Root: dir, AdmissionWait: time.Hour})
	pod := makePod("p", ctr{name: "app", req: map[string]int64{res: 1, other: 1}})
	a := newStub(t, PluginDir(dir), res, "a.sock", nil, devs("a1"))
	b := newStub(t, PluginDir(dir), other, "b.sock", nil, devs("b1"))
	once := false
	a.mu.Lock()
	a.allocate = func(ids []string) (*pluginapi.AllocateResponse, error) {
		if !once {
			once = true
			// b goes away while a allocates.
			b.endStreams()
			gone, cancel := m.Subscribe()
			defer cancel()
			for len(m.awaitedResources(pod)) == 0 {
				<-gone
			}
		}
		return &pluginapi.AllocateResponse{ContainerResponses: []*pluginapi.ContainerAllocateResponse{{}}}, nil
	}
	a.mu.Unlock()
	a.register(t, m.SocketPath())
	b.register(t, m.SocketPath())
	waitFor(t, m, "devices", func() bool { return allocatable(m, res) == 1 && allocatable(m, other) == 1 })
	admitted := make(chan error, 1)
	go func() {
		_, err := m.Admit(context.Background(), pod)
		admitted <- err
	}()
	waitFor(t, m, "the pod held again", func() bool { return slices.Equal(m.HeldPods(), []string{"default/p"}) })
	b2 := newStub(t, PluginDir(dir), other, "b2.sock", nil, devs("b1"))
	b2.register(t, m.SocketPath())
	if err := <-admitted; err != nil {
		t.Fatalf("once the plugin is back: %v", err)
	}
}
