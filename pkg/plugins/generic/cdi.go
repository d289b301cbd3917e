package generic

import (
	"slices"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// cdiSpec builds the CDI spec of the group's current devices: one CDI
// device per physical device, named by its ID, with its nodes; the mounts
// and environment apply to every device of the kind.
func (p *Plugin) cdiSpec(devs map[string]*device) cdispec.Spec {
	spec := cdispec.Spec{Version: plugins.CDIVersion, Kind: p.name, Devices: []cdispec.Device{}}
	ids := make([]string, 0, len(devs))
	for id := range devs {
		ids = append(ids, id)
	}
	devfs.SortNatural(ids)
	for _, id := range ids {
		d := devs[id]
		cd := cdispec.Device{Name: id}
		for _, n := range d.nodes {
			cd.ContainerEdits.DeviceNodes = append(cd.ContainerEdits.DeviceNodes, &cdispec.DeviceNode{
				Path: n.containerPath, HostPath: n.hostPath, Permissions: p.group.Permissions,
			})
		}
		spec.Devices = append(spec.Devices, cd)
	}
	for _, m := range p.group.Mounts {
		opts := []string{"rbind"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: opts, Type: "bind"})
	}
	for k, v := range p.group.Env {
		spec.ContainerEdits.Env = append(spec.ContainerEdits.Env, k+"="+v)
	}
	slices.Sort(spec.ContainerEdits.Env)
	return spec
}
