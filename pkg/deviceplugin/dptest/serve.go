package dptest

import (
	"context"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// Serve runs a deviceplugin.Server for resources against k until the test
// ends, registering through kubelet.sock. Set fields of cfg to change the
// defaults; PluginDir and Registration are always k's.
func Serve(t testing.TB, k *Kubelet, resources ...deviceplugin.Resource) *deviceplugin.Server {
	t.Helper()
	return ServeConfig(t, k, deviceplugin.Config{}, resources...)
}

// ServeConfig is Serve with a configuration.
func ServeConfig(t testing.TB, k *Kubelet, cfg deviceplugin.Config, resources ...deviceplugin.Resource) *deviceplugin.Server {
	t.Helper()
	cfg.PluginDir = k.PluginDir()
	cfg.KubeletSocket = k.SocketPath()
	cfg.Registration = deviceplugin.RegistrationKubelet
	srv, err := deviceplugin.NewServer(cfg, resources...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("device plugin server: %v", err)
		}
	})
	return srv
}

// Count is a WaitForDevices condition: n devices, whatever their health.
func Count(n int) func([]*pluginapi.Device) bool {
	return func(d []*pluginapi.Device) bool { return len(d) == n }
}

// Healthy is a WaitForDevices condition: exactly n healthy devices.
func Healthy(n int) func([]*pluginapi.Device) bool {
	return func(devs []*pluginapi.Device) bool {
		c := 0
		for _, d := range devs {
			if d.Health == pluginapi.Healthy {
				c++
			}
		}
		return c == n
	}
}

// Health is a WaitForDevices condition: device id has the given health.
func Health(id, health string) func([]*pluginapi.Device) bool {
	return func(devs []*pluginapi.Device) bool {
		for _, d := range devs {
			if d.ID == id {
				return d.Health == health
			}
		}
		return false
	}
}
