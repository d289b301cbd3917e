package deviceplugin

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
)

type noDevices struct{}

func (noDevices) Scan(ctx context.Context, _ func([]Device)) error { <-ctx.Done(); return nil }

func (noDevices) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{}, nil
}

// Several callers that see the same socket removal at once (the fsnotify
// handler, the registration loop, the resync) serve one new socket between
// them, and it answers: a second listen would close the socket the first
// caller is registering. Repeated, because the callers race.
func TestRelistenOncePerRemoval(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "dpl")
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{PluginDir: dir, Registration: RegistrationKubelet}.withDefaults()
	r := newResource(Resource{Name: "example.com/foo", Plugin: noDevices{}}, cfg, RegistrationKubelet, m)
	if err := r.listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.shutdown)
	const callers, removals = 4, 50
	for i := range removals {
		if err := os.Remove(r.socket()); err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		listened := 0
		for range callers {
			wg.Go(func() {
				<-start
				ok, err := r.relisten()
				if err != nil {
					t.Error(err)
				}
				if ok {
					mu.Lock()
					listened++
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if listened != 1 {
			t.Fatalf("removal %d: %d of %d callers listened again, want 1", i, listened, callers)
		}
		c, err := net.Dial("unix", r.socket())
		if err != nil {
			t.Fatalf("removal %d: the socket served now does not answer: %v", i, err)
		}
		_ = c.Close()
	}
}

// A socket-removed reason the registration loop takes after it already
// registered the socket served since (woken first for another reason)
// asks for no registration: the kubelet would refuse the same socket as
// "already connected". A socket served after that registration, or a
// registration that is not in place, still asks for one.
func TestSocketRemovedNeedsRegistration(t *testing.T) {
	t.Parallel()
	dir := testdir.Short(t, "dpl")
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{PluginDir: dir, Registration: RegistrationKubelet}.withDefaults()
	r := newResource(Resource{Name: "example.com/foo", Plugin: noDevices{}}, cfg, RegistrationKubelet, m)
	if err := r.listen(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.shutdown)
	registered := func() { // what registerOnce records
		r.mu.Lock()
		r.registeredListen = r.listens
		r.mu.Unlock()
		r.setRegistered(true, nil)
	}
	relisten := func() {
		if err := os.Remove(r.socket()); err != nil {
			t.Fatal(err)
		}
		if ok, err := r.relisten(); !ok || err != nil {
			t.Fatalf("relisten: %v, %v", ok, err)
		}
	}
	relisten()
	registered()
	if r.needsRegistration(reasonSocketRemoved) {
		t.Error("the socket served again is registered, yet socket-removed asks for a registration")
	}
	relisten()
	if !r.needsRegistration(reasonSocketRemoved) {
		t.Error("a socket served after the last registration does not ask for one")
	}
	registered()
	r.setRegistered(false, nil)
	if !r.needsRegistration(reasonSocketRemoved) {
		t.Error("an unregistered resource does not ask for a registration")
	}
}
