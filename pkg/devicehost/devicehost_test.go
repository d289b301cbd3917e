package devicehost_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dpkit/dpkit/pkg/devicehost"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
	"github.com/dpkit/dpkit/pkg/plugins/fake"
	"github.com/dpkit/dpkit/pkg/podresources"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHostServesPluginsAndPodResources runs the fake plugin through both
// registration paths against a host and checks the device manager counts
// its devices and the PodResources API answers.
func TestHostServesPluginsAndPodResources(t *testing.T) {
	for _, mode := range []deviceplugin.RegistrationMode{deviceplugin.RegistrationKubelet, deviceplugin.RegistrationRegistry} {
		t.Run(string(mode), func(t *testing.T) {
			root, err := os.MkdirTemp("", "dh")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(root) })
			host, err := devicehost.New(devicehost.Config{Root: root})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if err := host.Start(ctx, podresources.NewPodStore(), nil); err != nil {
				t.Fatal(err)
			}
			served := make(chan error, 1)
			go func() { served <- host.PodResources.Serve(ctx, host.PodResourcesSocket()) }()

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
			client, closer, err := podresources.Dial(ctx, host.PodResourcesSocket())
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
			if err := <-served; err != nil {
				t.Fatal(err)
			}
			host.Stop()
		})
	}
}
