package devicehost_test

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/dramanager/dratest"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		dratest.RemoveBinary()
		os.Exit(code)
	}))
}

// TestHostServesPluginsAndPodResources runs the fake plugin through both
// registration paths against a host and checks the device manager counts
// its devices and the PodResources API answers.
func TestHostServesPluginsAndPodResources(t *testing.T) {
	for _, mode := range []deviceplugin.RegistrationMode{deviceplugin.RegistrationKubelet, deviceplugin.RegistrationRegistry} {
		t.Run(string(mode), func(t *testing.T) {
			root, host, ctx, cancel := startHost(t)

			changes, unsubscribe := host.Manager.Subscribe()
			defer unsubscribe()
			cfg := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/foo"}}}
			cfg.Default()
			resources, err := fake.New(cfg, plugins.Options{})
			if err != nil {
				t.Fatal(err)
			}
			srv, err := deviceplugin.NewServer(deviceplugin.Config{
				PluginDir: filepath.Join(root, "device-plugins"), Registration: mode,
				RegistryDir: filepath.Join(root, "plugins_registry"),
			}, resources...)
			if err != nil {
				t.Fatal(err)
			}
			pctx, pcancel := context.WithCancel(ctx)
			pdone := make(chan error, 1)
			go func() { pdone <- srv.Run(pctx) }()

			timeout := time.After(10 * time.Second)
			for {
				if _, alloc := host.Manager.Capacity(); alloc["example.com/foo"] == 8 {
					break
				}
				select {
				case <-changes:
				case <-timeout:
					t.Fatalf("example.com/foo never reached 8 allocatable: %v", host.Manager.Resources())
				}
			}
			client, closer, err := prclient.Dial(ctx, host.PodResourcesSocket())
			if err != nil {
				t.Fatal(err)
			}
			defer closer.Close()
			alloc, err := client.GetAllocatableResources(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The kubelet answers with one entry per device; count the IDs.
			ids := 0
			for _, d := range alloc.Devices {
				if d.ResourceName != "example.com/foo" {
					t.Errorf("allocatable device of unexpected resource %q", d.ResourceName)
				}
				ids += len(d.DeviceIds)
			}
			if ids != 8 {
				t.Errorf("allocatable example.com/foo device IDs = %d, want 8: %v", ids, alloc.Devices)
			}

			pcancel()
			if err := <-pdone; err != nil {
				t.Fatal(err)
			}
			cancel()
			<-host.Done()
			if err := host.Err(); err != nil {
				t.Fatal(err)
			}
			host.Stop()
		})
	}
}

// TestRegistryModeLargePluginReady: a plugin with 100,000 devices that
// registers through the plugin watcher is registered and ready within
// 10 s, in 10 runs of 10. (The watcher may register it and say so before
// the plugin's first scan is done; the plugin must not undo that.)
func TestRegistryModeLargePluginReady(t *testing.T) {
	if testing.Short() {
		t.Skip("100,000 devices ten times; skipped under -short")
	}
	root, host, ctx, cancel := startHost(t)
	defer func() { cancel(); host.Stop() }()
	const devices = 100000
	for run := range 10 {
		cfg := fake.Config{Resources: []fake.ResourceConfig{{Name: "example.com/many", Count: devices}}}
		cfg.Default()
		resources, err := fake.New(cfg, plugins.Options{})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := deviceplugin.NewServer(deviceplugin.Config{
			PluginDir: filepath.Join(root, "device-plugins"), Registration: deviceplugin.RegistrationRegistry,
			RegistryDir: filepath.Join(root, "plugins_registry"),
		}, resources...)
		if err != nil {
			t.Fatal(err)
		}
		pctx, pcancel := context.WithCancel(ctx)
		pdone := make(chan error, 1)
		start := time.Now()
		go func() { pdone <- srv.Run(pctx) }()
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err = srv.WaitReady(wctx)
		wcancel()
		took := time.Since(start)
		if err != nil {
			t.Errorf("run %d: not ready 10 s after start: %v", run, err)
		} else {
			t.Logf("run %d: ready %v after start", run, took.Round(time.Millisecond))
		}
		// Once the manager has the devices (the first scan is long done),
		// the plugin is still registered and ready.
		waitAllocatable(t, host, "example.com/many", devices)
		if err := srv.Ready(); err != nil {
			t.Errorf("run %d: not ready once its %d devices were counted: %v", run, devices, err)
		}
		pcancel()
		if err := <-pdone; err != nil {
			t.Fatal(err)
		}
	}
}

// waitAllocatable waits until the host's device manager counts n
// allocatable devices of resource.
func waitAllocatable(t *testing.T, host *devicehost.Host, resource string, n int64) {
	t.Helper()
	changes, unsubscribe := host.Manager.Subscribe()
	defer unsubscribe()
	timeout := time.After(30 * time.Second)
	for {
		if _, alloc := host.Manager.Capacity(); alloc[resource] == n {
			return
		}
		select {
		case <-changes:
		case <-timeout:
			t.Fatalf("%s never reached %d allocatable: %v", resource, n, host.Manager.Resources())
		}
	}
}

// TestStop: Stop works whatever the caller did first (nothing, a Start, a
// context already ended, another Stop), from several goroutines, and
// removes the PodResources socket.
func TestStop(t *testing.T) {
	t.Parallel()
	newHost := func(t *testing.T) *devicehost.Host {
		t.Helper()
		host, err := devicehost.New(devicehost.Config{Root: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		return host
	}
	t.Run("before Start", func(t *testing.T) {
		t.Parallel()
		host := newHost(t)
		host.Stop()
		host.Stop()
		if err := host.Start(context.Background(), nil); err == nil {
			t.Fatal("Start after Stop succeeded")
		}
	})
	t.Run("after the context ended", func(t *testing.T) {
		t.Parallel()
		host := newHost(t)
		ctx, cancel := context.WithCancel(context.Background())
		if err := host.Start(ctx, nil); err != nil {
			t.Fatal(err)
		}
		cancel()
		<-host.Done()
		host.Stop()
		host.Stop()
		if err := host.Err(); err != nil {
			t.Errorf("Err() = %v after the context ended", err)
		}
	})
	t.Run("concurrently", func(t *testing.T) {
		t.Parallel()
		host := newHost(t)
		if err := host.Start(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		if err := host.Start(context.Background(), nil); err == nil {
			t.Error("second Start succeeded")
		}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(host.Stop)
		}
		wg.Wait()
		if _, err := os.Lstat(host.PodResourcesSocket()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("PodResources socket after Stop: %v, want it removed", err)
		}
	})
}

// startHost starts a host on a new short root (sockets need short paths).
// The caller cancels the context and stops the host.
func startHost(t *testing.T) (string, *devicehost.Host, context.Context, context.CancelFunc) {
	t.Helper()
	root := testdir.Short(t, "dh")
	host, err := devicehost.New(devicehost.Config{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := host.Start(ctx, nil); err != nil {
		cancel()
		t.Fatal(err)
	}
	return root, host, ctx, cancel
}
