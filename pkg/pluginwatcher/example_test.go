package pluginwatcher_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/pluginwatcher/pwtest"
)

// printHandler accepts every plugin and prints what happens to it.
type printHandler struct{ registered chan struct{} }

func (printHandler) ValidatePlugin(_ context.Context, name, _ string, versions []string) error {
	fmt.Println("validate", name, versions)
	return nil
}

func (h printHandler) RegisterPlugin(_ context.Context, name, _ string, _ []string) error {
	fmt.Println("register", name)
	close(h.registered)
	return nil
}

func (printHandler) DeRegisterPlugin(_ context.Context, name, _ string) {
	fmt.Println("deregister", name)
}

func Example() {
	root, _ := os.MkdirTemp("", "ex")
	defer os.RemoveAll(root)
	registry := filepath.Join(root, "plugins_registry")

	h := printHandler{registered: make(chan struct{})}
	w, err := pluginwatcher.New(pluginwatcher.Config{
		Dir:      registry,
		Handlers: map[string]pluginwatcher.Handler{pluginwatcher.DevicePlugin: h},
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := w.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}

	// A plugin appears in the registry directory.
	p, err := pwtest.StartPlugin(filepath.Join(registry, "gpu.sock"), &registerapi.PluginInfo{
		Type: pluginwatcher.DevicePlugin, Name: "example.com/gpu", SupportedVersions: []string{"v1beta1"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	select {
	case <-h.registered:
	case <-time.After(10 * time.Second):
		fmt.Println("timed out")
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	st, _ := p.WaitStatuses(sctx, 1)
	scancel()
	fmt.Println("plugin told registered:", st[0].PluginRegistered)
	for _, pl := range w.Plugins() {
		fmt.Println("listed:", pl.Type, pl.Name)
	}
	// Stop the watcher before the plugin goes: a socket removed while it
	// runs would be deregistered, racing the shutdown.
	cancel()
	<-w.Done()
	p.Close()
	// Output:
	// validate example.com/gpu [v1beta1]
	// register example.com/gpu
	// plugin told registered: true
	// listed: DevicePlugin example.com/gpu
}
