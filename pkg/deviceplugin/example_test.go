package deviceplugin_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// dongles is a complete device plugin: four dongles on NUMA node 0, each
// handed to containers as a device node and an environment variable.
type dongles struct{}

func (dongles) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	var devs []deviceplugin.Device
	for i := range 4 {
		devs = append(devs, deviceplugin.Device{ID: fmt.Sprintf("dongle%d", i), Healthy: true, NUMANodes: []int64{0}})
	}
	notify(devs) // call again whenever health or the set changes
	<-ctx.Done()
	return nil
}

func (dongles) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"DONGLES": strings.Join(ids, ",")}}
	for _, id := range ids {
		resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{HostPath: "/dev/" + id, ContainerPath: "/dev/" + id, Permissions: "rw"})
	}
	return resp, nil
}

func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := deviceplugin.Config{Logger: log} // kubelet's default directories
	if err := deviceplugin.Serve(ctx, cfg, "example.com/dongle", dongles{}); err != nil {
		log.Error("Device plugin failed", "err", err)
	}
}
