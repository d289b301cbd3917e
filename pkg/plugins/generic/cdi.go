package generic

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/internal/fileutil"
	"github.com/dpkit/dpkit/pkg/discovery/devfs"
)

// CDIVersion is the CDI spec version written.
const CDIVersion = "0.6.0"

// CDISpecFile returns the name of the spec file written for a resource.
func CDISpecFile(resource string) string {
	return "dpkit-" + strings.NewReplacer("/", "_", ".", "_").Replace(resource) + ".json"
}

// cdiSpec builds the CDI spec of the group's current devices: one CDI
// device per physical device, named by its ID, with its nodes; the mounts
// and environment apply to every device of the kind.
func (p *Plugin) cdiSpec(devs map[string]*device) cdispec.Spec {
	spec := cdispec.Spec{Version: CDIVersion, Kind: p.name, Devices: []cdispec.Device{}}
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

// writeCDISpec writes the spec atomically when it changed.
func (p *Plugin) writeCDISpec(devs map[string]*device) error {
	b, err := json.MarshalIndent(p.cdiSpec(devs), "", "  ")
	if err != nil {
		return fmt.Errorf("encode CDI spec: %w", err)
	}
	p.mu.Lock()
	same := p.cdi == string(b)
	p.mu.Unlock()
	if same {
		return nil
	}
	dir := p.cfg.CDI.SpecDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create CDI spec directory: %w", err)
	}
	if err := fileutil.WriteAtomic(filepath.Join(dir, CDISpecFile(p.name)), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write CDI spec: %w", err)
	}
	p.mu.Lock()
	p.cdi = string(b)
	p.mu.Unlock()
	return nil
}
