package draplugin

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// WatchHealthStatus reports the health of every device the driver
// publishes (held by a claim or not) on each change of the inventory's
// health or of the devices published, and again at least every
// HealthTimeout/2 so that the kubelet never times a report out while the
// driver runs. The helper serves it as DRAResourceHealth v1 and v1alpha1.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ch, stop := d.inv.Watch()
	defer stop()
	var last *kubeletplugin.DeviceHealthReport
	for {
		report, known := d.healthReport()
		if known {
			select {
			case <-ctx.Done():
				return nil
			case reports <- report:
			}
			last = &report
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-d.cfg.Clock.After(d.cfg.HealthTimeout / 2):
				break wait
			case <-ch:
				if next, _ := d.healthReport(); last == nil || !sameHealth(*last, next) {
					break wait
				}
				// A change of claims' holds only: nothing new to say.
			}
		}
	}
}

// healthReport is the health of the devices sliceDevices publishes: one
// the device plugin front gave a container is in no ResourceSlice, so no
// claim has it, and the kubelet drops a report of it (it matches reports
// to claims' devices by pool and name; dpkit verify --dra,
// dra.health.published-devices).
func (d *Driver) healthReport() (kubeletplugin.DeviceHealthReport, bool) {
	view, _, known := d.inv.DRAView()
	all, _ := d.inv.Devices()
	names := nameDevices(all, d.log)
	now := d.cfg.Clock.Now().Truncate(time.Second)
	var out kubeletplugin.DeviceHealthReport
	for _, dev := range view {
		name, ok := names.byID[dev.ID]
		if !ok {
			continue
		}
		dh := kubeletplugin.DeviceHealth{
			PoolName:           d.cfg.PoolName,
			DeviceName:         name,
			Health:             kubeletplugin.HealthStatusHealthy,
			LastUpdated:        now,
			HealthCheckTimeout: d.cfg.HealthTimeout,
			Message:            "the plugin reports the device healthy",
		}
		if !dev.Healthy {
			dh.Health = kubeletplugin.HealthStatusUnhealthy
			dh.Message = "the plugin reports the device unhealthy"
		}
		out.Devices = append(out.Devices, dh)
	}
	return out, known
}

func sameHealth(a, b kubeletplugin.DeviceHealthReport) bool {
	if len(a.Devices) != len(b.Devices) {
		return false
	}
	for i := range a.Devices {
		x, y := a.Devices[i], b.Devices[i]
		if x.DeviceName != y.DeviceName || x.Health != y.Health {
			return false
		}
	}
	return true
}
