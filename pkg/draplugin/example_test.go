package draplugin_test

import (
	"context"
	"log/slog"
	"os"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/draplugin"
)

type dongles struct{}

func (dongles) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	notify([]deviceplugin.Device{{ID: "dongle0", Healthy: true}})
	<-ctx.Done()
	return nil
}

func (dongles) Allocate(context.Context, []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{}, nil
}

// A plugin served through the device plugin API and DRA at once: the line
// that replaces deviceplugin.Serve in examples/myplugin.
func ExampleServe() {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := draplugin.Serve(ctx, deviceplugin.Config{Logger: log},
		draplugin.Config{DriverName: "dongle.example.com", NodeName: os.Getenv("NODE_NAME"), Logger: log},
		"example.com/dongle", dongles{})
	if err != nil {
		log.Error("Plugin failed", "err", err)
	}
}
