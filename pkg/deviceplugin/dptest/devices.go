package dptest

import (
	"context"
	"slices"
	"strings"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/broadcast"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// EnvDevices is the environment variable a Devices plugin's Allocate sets
// to the comma-separated IDs a container got.
const EnvDevices = "DPTEST_DEVICES"

// Devices is a device plugin whose devices a test changes while it runs,
// for health flows: every device is healthy at first, and SetHealth
// reaches every ListAndWatch stream at once. Allocate sets EnvDevices.
//
//	d := dptest.NewDevices("dev-0", "dev-1")
//	dptest.Serve(t, k, deviceplugin.Resource{Name: "example.com/foo", Plugin: d})
//	d.SetHealth("dev-1", false)
type Devices struct {
	mu      sync.Mutex
	devs    []deviceplugin.Device
	changed broadcast.Change
}

// NewDevices returns a plugin with healthy devices of the given IDs.
func NewDevices(ids ...string) *Devices {
	d := &Devices{}
	for _, id := range ids {
		d.devs = append(d.devs, deviceplugin.Device{ID: id, Healthy: true})
	}
	return d
}

// SetHealth sets the health of device id and reports whether the plugin
// has that device.
func (d *Devices) SetHealth(id string, healthy bool) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.IndexFunc(d.devs, func(dev deviceplugin.Device) bool { return dev.ID == id })
	if i < 0 {
		return false
	}
	d.devs = slices.Clone(d.devs)
	d.devs[i].Healthy = healthy
	d.changed.Broadcast()
	return true
}

// Scan implements deviceplugin.Plugin.
func (d *Devices) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	for {
		changed := d.changed.C()
		d.mu.Lock()
		devs := d.devs
		d.mu.Unlock()
		notify(devs)
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// Allocate implements deviceplugin.Plugin.
func (d *Devices) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{EnvDevices: strings.Join(ids, ",")}}, nil
}

// PreStarting returns the plugin asking the kubelet for PreStartContainer
// calls (PreStartRequired), each handed to f.
func (d *Devices) PreStarting(f func(ctx context.Context, ids []string) error) deviceplugin.Plugin {
	return &preStartingDevices{d, f}
}

type preStartingDevices struct {
	*Devices
	f func(ctx context.Context, ids []string) error
}

func (p *preStartingDevices) PreStartContainer(ctx context.Context, ids []string) error {
	return p.f(ctx, ids)
}
