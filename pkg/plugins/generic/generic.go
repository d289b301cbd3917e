// Package generic is a device plugin for any device a host exposes as
// device nodes: groups of paths and globs (/dev/ttyUSB*), USB devices by
// vendor:product (and serial), and PCI functions by vendor, device and
// class (VFIO groups or DRM nodes). Each group is one resource. A device
// may be shared by Count containers. Devices that appear or disappear are
// picked up from change notifications on the dev root and a periodic
// rescan; a device is unhealthy while one of its nodes is missing or not
// readable.
package generic

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/discovery/pci"
	"github.com/dpkit/dpkit/pkg/discovery/usb"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// New returns one resource per group. cfg must have been defaulted; it is
// validated here.
func New(cfg Config, opts plugins.Options) ([]deviceplugin.Resource, error) {
	if errs := cfg.Validate(nil); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	opts = opts.Defaults()
	out := make([]deviceplugin.Resource, 0, len(cfg.Groups))
	for _, g := range cfg.Groups {
		name := cfg.ResourceName(g)
		p := &Plugin{
			name:  name,
			group: g,
			cfg:   cfg,
			opts:  opts,
			log:   opts.Logger.With("plugin", "generic", "resource", name),
			cdi:   plugins.CDIWriter{Dir: cfg.CDI.SpecDir},
		}
		out = append(out, deviceplugin.Resource{Name: name, Plugin: p})
	}
	return out, nil
}

// Plugin serves one group.
type Plugin struct {
	name  string
	group Group
	cfg   Config
	opts  plugins.Options
	log   *slog.Logger

	mu      sync.Mutex
	devices map[string]*device // base ID -> device
	cdi     plugins.CDIWriter  // when CDI is enabled
	// denied are the device nodes this process may not open, each said
	// once.
	denied sync.Map
}

// device is one physical device of the group.
type device struct {
	id    string
	nodes []nodeSpec
	numa  int
	// healthy: every node exists and is readable.
	healthy bool
	reason  string
	// info is what Describe returns for the device's IDs.
	info deviceplugin.DeviceInfo
}

type nodeSpec struct {
	hostPath, containerPath string
}

var (
	_ deviceplugin.PreferredAllocator = (*Plugin)(nil)
	_ deviceplugin.Describer          = (*Plugin)(nil)
)

// attrs builds attributes from name/value pairs, leaving out empty values.
func attrs(kv ...string) map[string]deviceplugin.Attribute {
	out := make(map[string]deviceplugin.Attribute, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			out[kv[i]] = deviceplugin.StringAttr(kv[i+1])
		}
	}
	return out
}

// Describe returns what discovery knows about the device behind id (every
// share of a shared device is described as the device): for a device
// node, its host path (attribute path); for a USB device, vendorID,
// productID and serial (when it has one); for a PCI function, its PCI
// address, vendorID, deviceID and class. IDs are lower-case hex, as lsusb
// and lspci show them.
func (p *Plugin) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	base := p.sharing().Device(id)
	d, ok := p.devices[base]
	if !ok || !slices.Contains(p.sharing().IDs(base), id) {
		return deviceplugin.DeviceInfo{}, false
	}
	return d.info, true
}

// Scan watches the dev root and rescans sysfs periodically.
func (p *Plugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	w := &devfs.Watcher{
		Dirs:     p.watchDirs(),
		Interval: p.cfg.RescanInterval.Duration,
		Logger:   p.log,
		Rescan: func() {
			devs := p.discover()
			p.mu.Lock()
			p.devices = devs
			p.mu.Unlock()
			if p.cfg.CDI.Enabled {
				if err := p.cdi.Write(p.cdiSpec(devs)); err != nil {
					p.log.Error("Cannot write CDI spec", "err", err)
				}
			}
			notify(p.snapshot(devs))
		},
	}
	err := w.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// watchDirs are the local directories whose changes can change the group.
func (p *Plugin) watchDirs() []string {
	root := p.opts.DevRoot
	dirs := []string{root}
	add := func(d string) {
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, ps := range p.group.Paths {
		rel, err := devfs.Rel(ps.Path)
		if err != nil {
			continue
		}
		parent := filepath.Dir(filepath.Join(root, rel))
		if devfs.HasMeta(parent) {
			m, _ := filepath.Glob(parent)
			for _, d := range m {
				add(d)
			}
			continue
		}
		add(parent)
	}
	if len(p.group.USB) > 0 {
		add(filepath.Join(root, "bus/usb"))
		m, _ := filepath.Glob(filepath.Join(root, "bus/usb/*"))
		for _, d := range m {
			add(d)
		}
	}
	if len(p.group.PCI) > 0 {
		add(filepath.Join(root, "vfio"))
		add(filepath.Join(root, "dri"))
	}
	return dirs
}

// noteDenied says once per node that the plugin may not open it, and
// that its health does not depend on that.
func (p *Plugin) noteDenied(path string, err error) {
	if _, said := p.denied.LoadOrStore(path, true); said {
		return
	}
	p.log.Info("The plugin may not open this device node; the device is healthy while its node exists, and containers it is allocated to are given access by their runtime. Nothing to fix unless the plugin itself must open it: then run the plugin privileged or with the device in its container",
		"path", path, "err", err)
}

// discover reads the group's devices from the host.
func (p *Plugin) discover() map[string]*device {
	root := p.opts.DevRoot
	devs := make(map[string]*device)
	put := func(d *device) {
		if _, dup := devs[d.id]; dup {
			return
		}
		d.healthy, d.reason = true, ""
		for _, n := range d.nodes {
			st := devfs.Stat(root, n.hostPath)
			if st.Denied {
				// The device is there; the plugin's own container may
				// not open it, which the containers it is allocated to
				// may (their runtime grants it).
				p.noteDenied(n.hostPath, st.Err)
				continue
			}
			if !st.Accessible {
				d.healthy = false
				d.reason = fmt.Sprint(st.Err)
				break
			}
		}
		devs[d.id] = d
	}
	for _, ps := range p.group.Paths {
		if !devfs.HasMeta(ps.Path) {
			// A named node is always listed; it is unhealthy while missing.
			cp := cmp.Or(ps.ContainerPath, ps.Path)
			put(&device{id: pathID(ps.Path), nodes: []nodeSpec{{ps.Path, cp}}, numa: numa.None,
				info: deviceplugin.DeviceInfo{Attributes: attrs("path", ps.Path)}})
			continue
		}
		matches, err := devfs.Glob(root, ps.Path)
		if err != nil {
			p.log.Warn("Cannot expand path", "path", ps.Path, "err", err)
			continue
		}
		for _, m := range matches {
			if st := devfs.Stat(root, m); st.Dir {
				continue // directories matched by a broad glob
			}
			put(&device{id: pathID(m), nodes: []nodeSpec{{m, m}}, numa: numa.None,
				info: deviceplugin.DeviceInfo{Attributes: attrs("path", m)}})
		}
	}
	if len(p.group.USB) > 0 {
		all, err := usb.Scan(p.opts.SysfsRoot)
		if err != nil {
			p.log.Warn("Cannot scan USB devices", "err", err)
		}
		for _, u := range all {
			if !matchUSB(p.group.USB, u) {
				continue
			}
			d := &device{id: "usb-" + u.Name, numa: u.NUMANode, info: deviceplugin.DeviceInfo{
				Attributes: attrs("vendorID", u.Vendor, "productID", u.Product, "serial", u.Serial),
			}}
			d.nodes = append(d.nodes, nodeSpec{u.Node(), u.Node()})
			for _, t := range u.TTYs {
				d.nodes = append(d.nodes, nodeSpec{t, t})
			}
			put(d)
		}
	}
	if len(p.group.PCI) > 0 {
		all, err := pci.Scan(p.opts.SysfsRoot)
		if err != nil {
			p.log.Warn("Cannot scan PCI devices", "err", err)
		}
		for _, f := range all {
			if !matchPCI(p.group.PCI, f) {
				continue
			}
			d := &device{id: "pci-" + f.Address, numa: f.NUMANode, info: deviceplugin.DeviceInfo{
				PCIBusID:   f.Address,
				Attributes: attrs("vendorID", f.Vendor, "deviceID", f.Device, "class", f.Class),
			}}
			if f.Driver == "vfio-pci" && f.IOMMUGroup != "" {
				d.nodes = append(d.nodes, nodeSpec{"/dev/vfio/vfio", "/dev/vfio/vfio"}, nodeSpec{f.VFIONode(), f.VFIONode()})
			} else {
				cards, renders := f.DRMNodes()
				for _, n := range append(cards, renders...) {
					d.nodes = append(d.nodes, nodeSpec{n, n})
				}
			}
			if len(d.nodes) == 0 {
				p.log.Debug("PCI function has no device node to expose; bind it to vfio-pci", "address", f.Address, "driver", f.Driver)
				continue
			}
			put(d)
		}
	}
	return devs
}

func matchUSB(specs []USBSpec, u usb.Device) bool {
	for _, s := range specs {
		if s.Vendor == u.Vendor && (s.Product == "" || s.Product == u.Product) && (s.Serial == "" || s.Serial == u.Serial) {
			return true
		}
	}
	return false
}

func matchPCI(specs []PCISpec, f pci.Device) bool {
	for _, s := range specs {
		if (s.Vendor == "" || s.Vendor == f.Vendor) && (s.Device == "" || s.Device == f.Device) && strings.HasPrefix(f.Class, s.Class) {
			return true
		}
	}
	return false
}

// pathID names a device by its path below /dev: /dev/ttyUSB0 -> ttyUSB0,
// /dev/net/tun -> net_tun.
func pathID(hostPath string) string {
	rel, err := devfs.Rel(hostPath)
	if err != nil {
		rel = hostPath
	}
	return strings.ReplaceAll(rel, "/", "_")
}

// snapshot expands devices into Count IDs each.
func (p *Plugin) snapshot(devs map[string]*device) []deviceplugin.Device {
	ids := make([]string, 0, len(devs))
	for id := range devs {
		ids = append(ids, id)
	}
	devfs.SortNatural(ids)
	out := make([]deviceplugin.Device, 0, len(ids)*p.group.Count)
	for _, id := range ids {
		d := devs[id]
		if !d.healthy {
			p.log.Debug("Device unhealthy", "device", id, "reason", d.reason)
		}
		for _, sid := range p.sharing().IDs(id) {
			out = append(out, deviceplugin.Device{ID: sid, Healthy: d.healthy, NUMANodes: numa.Nodes(d.numa)})
		}
	}
	return out
}

// sharing names the IDs advertised for shared devices: id-0 ...
// id-(Count-1).
func (p *Plugin) sharing() plugins.Sharing { return plugins.Sharing{N: p.group.Count, Sep: "-"} }

// Allocate gives the container the nodes of the devices behind ids (each
// once, however many shares it got), the group's mounts and environment,
// or, with CDI enabled, the devices' CDI names.
func (p *Plugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &pluginapi.ContainerAllocateResponse{}
	seenDev := make(map[string]bool)
	seenNode := make(map[string]bool)
	for _, id := range ids {
		base := p.sharing().Device(id)
		d, ok := p.devices[base]
		if !ok {
			return nil, fmt.Errorf("device %s is no longer present", id)
		}
		if seenDev[base] {
			continue
		}
		seenDev[base] = true
		if p.cfg.CDI.Enabled {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: p.name + "=" + base})
			continue
		}
		for _, n := range d.nodes {
			if seenNode[n.containerPath] {
				continue
			}
			seenNode[n.containerPath] = true
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{
				ContainerPath: n.containerPath,
				HostPath:      n.hostPath,
				Permissions:   p.group.Permissions,
			})
		}
	}
	if p.cfg.CDI.Enabled {
		return resp, nil
	}
	for _, m := range p.group.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	if len(p.group.Env) > 0 {
		resp.Envs = make(map[string]string, len(p.group.Env))
		for k, v := range p.group.Env {
			resp.Envs[k] = v
		}
	}
	return resp, nil
}

// PreferredAllocation packs the request onto as few NUMA nodes as
// possible and spreads shares over devices.
func (p *Plugin) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	if p.group.Count == 1 {
		return deviceplugin.PackNUMA(req), nil
	}
	// Shared devices: spread a request over physical devices.
	req.Available = slices.Clone(req.Available)
	slices.SortStableFunc(req.Available, func(a, b deviceplugin.Device) int { return deviceplugin.CompareIDs(a.ID, b.ID) })
	return deviceplugin.PackNUMAGroups(req, p.sharing().Device), nil
}
