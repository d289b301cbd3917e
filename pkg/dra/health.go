package dra

import (
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
)

// healthService serves DRAResourceHealth.
type healthService struct {
	drahealthv1.UnimplementedDRAResourceHealthServer
	d *Driver
}

// NodeWatchResources sends the health of every device (held or not) on
// each change of the inventory, and again at least every HealthTimeout/2
// so that the kubelet never times a report out while the driver runs.
func (h healthService) NodeWatchResources(_ *drahealthv1.NodeWatchResourcesRequest, stream drahealthv1.DRAResourceHealth_NodeWatchResourcesServer) error {
	d := h.d
	ch, stop := d.inv.Watch()
	defer stop()
	ctx := stream.Context()
	var last *drahealthv1.NodeWatchResourcesResponse
	for {
		msg, known := d.healthReport()
		if known {
			if err := stream.Send(msg); err != nil {
				return err
			}
			last = msg
		}
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-d.cfg.Clock.After(d.cfg.HealthTimeout / 2):
			case <-ch:
				if next, _ := d.healthReport(); last != nil && sameHealth(last, next) {
					continue // a change of holds only: nothing new to say
				}
			}
			break
		}
	}
}

func (d *Driver) healthReport() (*drahealthv1.NodeWatchResourcesResponse, bool) {
	devs, known := d.inv.Devices()
	names := nameDevices(devs, d.log)
	now := d.cfg.Clock.Now().Unix()
	msg := &drahealthv1.NodeWatchResourcesResponse{}
	for _, dev := range devs {
		name, ok := names.byID[dev.ID]
		if !ok {
			continue
		}
		dh := &drahealthv1.DeviceHealth{
			Device:                    &drahealthv1.DeviceIdentifier{PoolName: d.cfg.PoolName, DeviceName: name},
			Health:                    drahealthv1.HealthStatus_HEALTHY,
			LastUpdatedTime:           now,
			HealthCheckTimeoutSeconds: int64(d.cfg.HealthTimeout.Seconds()),
			Message:                   "the plugin reports the device healthy",
		}
		if !dev.Healthy {
			dh.Health = drahealthv1.HealthStatus_UNHEALTHY
			dh.Message = "the plugin reports the device unhealthy"
		}
		msg.Devices = append(msg.Devices, dh)
	}
	return msg, known
}

func sameHealth(a, b *drahealthv1.NodeWatchResourcesResponse) bool {
	if len(a.Devices) != len(b.Devices) {
		return false
	}
	for i := range a.Devices {
		x, y := a.Devices[i], b.Devices[i]
		if x.GetDevice().GetDeviceName() != y.GetDevice().GetDeviceName() || x.GetHealth() != y.GetHealth() {
			return false
		}
	}
	return true
}
