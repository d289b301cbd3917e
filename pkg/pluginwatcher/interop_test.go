package pluginwatcher

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/testdir"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/pluginwatcher/pwtest"
)

type onePlugin struct{}

func (onePlugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	notify([]deviceplugin.Device{{ID: "d0", Healthy: true}})
	<-ctx.Done()
	return nil
}

func (onePlugin) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{}, nil
}

// TestSDKPluginInRegistryMode checks that a plugin built on dpkit's SDK in
// registry mode is found, registered and deregistered by the watcher.
func TestSDKPluginInRegistryMode(t *testing.T) {
	t.Parallel()
	root := testdir.Short(t, "pw")
	registry := filepath.Join(root, "reg")
	h := &pwtest.Handler{}
	w := startWatcher(t, Config{Dir: registry, Handlers: map[string]Handler{DevicePlugin: h}})

	srv, err := deviceplugin.NewServer(deviceplugin.Config{
		PluginDir:    filepath.Join(root, "dp"),
		Registration: deviceplugin.RegistrationRegistry,
		RegistryDir:  registry,
		InstanceID:   "t",
	}, deviceplugin.Resource{Name: "example.com/foo", Plugin: onePlugin{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	if err := srv.WaitReady(waitCtx(t)); err != nil {
		t.Fatalf("SDK plugin never heard it was registered: %v", err)
	}
	calls := wantOps(t, h, "validate", "register")
	c := calls[1]
	if c.Name != "example.com/foo" || !strings.HasPrefix(c.Endpoint, root+"/") || len(c.Versions) == 0 {
		t.Errorf("RegisterPlugin(%q, %q, %v), want example.com/foo at one of the plugin's sockets", c.Name, c.Endpoint, c.Versions)
	}
	if fi, err := os.Lstat(c.Endpoint); err != nil || fi.Mode()&fs.ModeSocket == 0 {
		t.Errorf("endpoint %s is not a socket: %v", c.Endpoint, err)
	}
	if p := w.Plugins(); len(p) != 1 || p[0].Type != DevicePlugin {
		t.Errorf("Plugins() = %+v", p)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("SDK server: %v", err)
	}
	done <- nil
	wantOps(t, h, "validate", "register", "deregister")
}
