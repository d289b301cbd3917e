// Command myplugin is the README's plugin with one bug, for dpkit verify's
// tests: two seconds after it starts, dongle3 turns unhealthy and the
// plugin passes notify only that device, so the three others vanish.
// listandwatch.vanished-devices catches it.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

type dongles struct{}

func (dongles) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	var devs []deviceplugin.Device
	for i := range 4 {
		devs = append(devs, deviceplugin.Device{ID: fmt.Sprintf("dongle%d", i), Healthy: true, NUMANodes: []int64{0}})
	}
	notify(devs) // call again, with the full list, whenever anything changes
	select {
	case <-time.After(2 * time.Second):
	case <-ctx.Done():
		return nil
	}
	// Bug: a health change sends only the device that changed.
	notify([]deviceplugin.Device{{ID: "dongle3", Healthy: false, NUMANodes: []int64{0}}})
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	// The zero Config serves in the kubelet's /var/lib/kubelet/device-plugins,
	// or in $DPKIT_PLUGIN_DIR when set: dpkit verify sets it.
	err := deviceplugin.Serve(ctx, deviceplugin.Config{Logger: log}, "example.com/dongle", dongles{})
	if err != nil {
		log.Error("Device plugin failed", "err", err)
		os.Exit(1)
	}
}
