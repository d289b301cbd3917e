package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicemanager"
)

// TestPluginCrashLoopLeavesNothingBehind runs dpkit's emulated kubelet
// in this process and "dpkit plugin" (examples/fake.yaml, registering
// through plugins_registry) as a real process that is killed with SIGKILL
// 50 times, each time after it registered. Each crash leaves its socket
// file behind. Afterwards, with one live instance running: at most that
// instance's socket is left in plugins_registry, and the emulator's
// goroutines are back to what they were with one live instance before the
// crashes (the watcher forgot the dead sockets instead of retrying them).
func TestPluginCrashLoopLeavesNothingBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dpkit plugin 52 times; skipped under -short")
	}
	dpkit := dpkitBinary(t)
	config, err := filepath.Abs(filepath.Join("..", "..", "examples", "fake.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	root := testdir.Short(t, "dpup")
	ctx, cancel := context.WithCancel(testContext(t))
	started := make(chan *emulator.Emulator, 1)
	done := make(chan error, 1)
	go func() {
		done <- emulator.Run(ctx, emulator.Options{Root: root}, func(e *emulator.Emulator) { started <- e })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("emulator: %v", err)
		}
	}()
	var e *emulator.Emulator
	select {
	case e = <-started:
	case err := <-done:
		t.Fatalf("emulator: %v", err)
	}
	m := e.Manager()
	registry := filepath.Join(root, "plugins_registry")
	run := func(i int) *proc {
		p := startProc(t, filepath.Join(root, fmt.Sprintf("plugin-%d.log", i)), nil, dpkit, "plugin", "--config", config,
			"--plugin-dir", filepath.Join(root, "device-plugins"), "--registry-dir", registry, "--registration", "registry")
		waitManager(t, m, fmt.Sprintf("run %d registered with 8 devices", i), func() bool {
			_, a := m.Capacity()
			return a[fooResource] == 8
		})
		return p
	}

	p := run(0)
	baseline := settledGoroutines(t, 0)
	if baseline == 0 {
		t.Fatal("no goroutine of the emulator found in the goroutine profile")
	}
	t.Logf("emulator goroutines with one live plugin: %d", baseline)
	const crashes = 50
	for i := 1; i <= crashes; i++ {
		p.stop(t, syscall.SIGKILL)
		waitManager(t, m, fmt.Sprintf("crash %d noticed", i), func() bool {
			_, a := m.Capacity()
			return a[fooResource] == 0
		})
		p = run(i)
	}
	socks := socketsIn(t, registry)
	var ours []string
	for _, s := range socks {
		if strings.HasPrefix(s, "example_com_foo-") {
			ours = append(ours, s)
		}
	}
	if len(ours) != 1 {
		t.Errorf("sockets of %s in plugins_registry after %d crashes: %v; want the live instance's only", fooResource, crashes, ours)
	}
	// A leak never shrinks: on a loaded machine, connections of the last
	// crashes may still be closing when the count first holds still for
	// a second, so wait (up to 30 s) for it to come down to the bound.
	after := settledGoroutines(t, baseline+2)
	t.Logf("emulator goroutines after %d crashes, one live plugin: %d (before: %d)", crashes, after, baseline)
	if after > baseline+2 {
		t.Errorf("goroutines %d after %d crashes, %d before", after, crashes, baseline)
	}
}

// settledGoroutines returns the number of goroutines of the emulator in
// this process once it has not changed for a second (connections being
// torn down end their goroutines) and, when atMost is not 0, is at most
// atMost; after 30 s it returns the last count. Other tests of the
// package share the process, so only goroutines whose stack runs through
// the emulator's packages or gRPC (which only the emulator and its
// plugins' connections use here) are counted.
func settledGoroutines(t *testing.T, atMost int) int {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(30 * time.Second)
	last, same := emulatorGoroutines(), 0
	for {
		select {
		case <-tick.C:
		case <-deadline:
			return last
		}
		n := emulatorGoroutines()
		if n == last {
			if same++; same >= 20 && (atMost == 0 || n <= atMost) { // a second without change
				return n
			}
		} else {
			last, same = n, 0
		}
	}
}

// emulatorGoroutines counts the goroutines whose stack (with the frame
// that created it) mentions the emulator's packages or gRPC.
func emulatorGoroutines() int {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		for _, pkg := range []string{"google.golang.org/grpc", "dpkit/pkg/pluginwatcher", "dpkit/pkg/devicemanager",
			"dpkit/pkg/devicehost", "dpkit/pkg/podresources", "dpkit/internal/emulator"} {
			if strings.Contains(g, pkg) {
				n++
				break
			}
		}
	}
	return n
}

// waitManager waits until cond holds, re-checking on every change of the
// device manager.
func waitManager(t *testing.T, m *devicemanager.Manager, what string, cond func() bool) {
	t.Helper()
	ch, unsubscribe := m.Subscribe()
	defer unsubscribe()
	deadline := time.NewTimer(waitTimeout)
	defer deadline.Stop()
	for !cond() {
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("no %s in %v: %+v", what, waitTimeout, m.Resources())
		}
	}
}
