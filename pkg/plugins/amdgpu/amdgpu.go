// Package amdgpu is a device plugin for AMD GPUs. It discovers GPUs like
// the ROCm stack does, from the KFD topology in sysfs (see
// pkg/discovery/amd), reports each GPU's NUMA node, marks a GPU unhealthy
// while /dev/kfd or its DRM nodes are missing or unreadable, while it is in
// another compute partition mode than configured, or after it vanished
// from the topology, and gives a container /dev/kfd plus its GPUs' render
// (and card) nodes.
package amdgpu

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/discovery/amd"
	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// Defaults.
const (
	DefaultResourceName   = "amd.com/gpu"
	DefaultRescanInterval = 10 * time.Second
)

// Config is the amdgpu plugin's section of the plugin config file:
//
//	amdgpu:
//	  resourceName: amd.com/gpu
//	  computePartition: SPX
type Config struct {
	// ResourceName is the extended resource. Default amd.com/gpu.
	ResourceName string `json:"resourceName,omitempty"`
	// RescanInterval is how often the KFD topology is read again (sysfs
	// has no change notifications); /dev changes are seen at once.
	// Default 10s.
	RescanInterval plugins.Duration `json:"rescanInterval,omitempty"`
	// ComputePartition, when set (SPX, DPX, TPX, QPX, CPX), marks GPUs
	// that report another current_compute_partition unhealthy. GPUs that
	// report none are not affected.
	ComputePartition string `json:"computePartition,omitempty"`
	// OmitCardNodes leaves /dev/dri/card* out of allocations (compute
	// needs only /dev/kfd and the render node).
	OmitCardNodes bool `json:"omitCardNodes,omitempty"`
}

// Default fills unset fields.
func (c *Config) Default() {
	if c.ResourceName == "" {
		c.ResourceName = DefaultResourceName
	}
	if c.RescanInterval.Duration == 0 {
		c.RescanInterval.Duration = DefaultRescanInterval
	}
}

var partitions = []string{"SPX", "DPX", "TPX", "QPX", "CPX"}

// Validate reports every problem in c with its field path.
func (c *Config) Validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if err := deviceplugin.ValidateResourceName(c.ResourceName); err != nil {
		errs = append(errs, field.Invalid(p.Child("resourceName"), c.ResourceName, err.Error()))
	}
	if c.RescanInterval.Duration < 100*time.Millisecond {
		errs = append(errs, field.Invalid(p.Child("rescanInterval"), c.RescanInterval.String(), "must be at least 100ms, e.g. 10s"))
	}
	if c.ComputePartition != "" && !slices.Contains(partitions, c.ComputePartition) {
		errs = append(errs, field.NotSupported(p.Child("computePartition"), c.ComputePartition, partitions))
	}
	return errs
}

// New returns the amdgpu resource. cfg must have been defaulted; it is
// validated here.
func New(cfg Config, opts plugins.Options) ([]deviceplugin.Resource, error) {
	if errs := cfg.Validate(nil); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	opts = opts.Defaults()
	p := &Plugin{cfg: cfg, opts: opts, log: opts.Logger.With("plugin", "amdgpu", "resource", cfg.ResourceName)}
	return []deviceplugin.Resource{{Name: cfg.ResourceName, Plugin: p}}, nil
}

// Plugin serves AMD GPUs.
type Plugin struct {
	cfg  Config
	opts plugins.Options
	log  *slog.Logger

	mu   sync.Mutex
	gpus map[string]gpu // by ID; vanished GPUs stay, unhealthy
}

type gpu struct {
	amd.GPU
	id      string
	healthy bool
	reason  string
	present bool
	// parts is how many partitions the GPU at this PCI address has; 1
	// when it is whole.
	parts int
}

var (
	_ deviceplugin.PreferredAllocator = (*Plugin)(nil)
	_ deviceplugin.Describer          = (*Plugin)(nil)
)

// Scan watches /dev and /dev/dri and rereads the topology periodically.
func (p *Plugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	w := &devfs.Watcher{
		Dirs:     []string{p.opts.DevRoot, filepath.Join(p.opts.DevRoot, "dri")},
		Interval: p.cfg.RescanInterval.Duration,
		Logger:   p.log,
		Rescan:   func() { notify(p.rescan()) },
	}
	err := w.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (p *Plugin) rescan() []deviceplugin.Device {
	found, err := amd.Scan(p.opts.SysfsRoot)
	if err != nil {
		p.log.Warn("Cannot read the KFD topology", "err", err)
	}
	// IDs: the PCI address; partitions of one device get -p<n> suffixes.
	perBus := make(map[string]int)
	for _, g := range found {
		perBus[g.BusID]++
	}
	index := make(map[string]int)
	current := make(map[string]gpu, len(found))
	for _, g := range found {
		id := g.BusID
		if id == "" {
			id = fmt.Sprintf("kfd-node-%d", g.Node)
		}
		if perBus[g.BusID] > 1 {
			id = fmt.Sprintf("%s-p%d", g.BusID, index[g.BusID])
			index[g.BusID]++
		}
		current[id] = p.check(gpu{GPU: g, id: id, present: true, parts: perBus[g.BusID]})
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, old := range p.gpus {
		if _, ok := current[id]; !ok {
			old.present, old.healthy, old.reason = false, false, "GPU vanished from the KFD topology"
			current[id] = old
		}
	}
	p.gpus = current
	ids := make([]string, 0, len(current))
	for id := range current {
		ids = append(ids, id)
	}
	devfs.SortNatural(ids)
	out := make([]deviceplugin.Device, 0, len(ids))
	for _, id := range ids {
		g := current[id]
		if !g.healthy {
			p.log.Debug("GPU unhealthy", "device", id, "reason", g.reason)
		}
		out = append(out, deviceplugin.Device{ID: id, Healthy: g.healthy, NUMANodes: numa.Nodes(g.NUMANode)})
	}
	return out
}

// Describe returns what the KFD topology and the PCI device say about the
// GPU (or partition) id: its PCI address and the attributes deviceID (PCI
// device ID, lower-case hex), renderMinor, partition, and productName,
// uniqueID, computePartition and memoryPartition when the GPU reports
// them; a compute partition also has profile, parent and xccs, and takes
// its XCCs from its GPU's counter set. The topology has no memory size
// dpkit reads, so no capacity is published.
func (p *Plugin) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.gpus[id]
	if !ok {
		return deviceplugin.DeviceInfo{}, false
	}
	info := deviceplugin.DeviceInfo{
		PCIBusID:   g.BusID,
		Attributes: map[string]deviceplugin.Attribute{"deviceID": deviceplugin.StringAttr(g.DeviceID)},
	}
	for name, v := range map[string]string{
		"productName":      g.ProductName,
		"uniqueID":         g.UniqueID,
		"computePartition": g.ComputePartition,
		"memoryPartition":  g.MemoryPartition,
	} {
		if v != "" {
			info.Attributes[name] = deviceplugin.StringAttr(v)
		}
	}
	if g.RenderMinor >= 0 {
		info.Attributes["renderMinor"] = deviceplugin.IntAttr(int64(g.RenderMinor))
	}
	p.describePartition(g, &info)
	return info, true
}

func (p *Plugin) check(g gpu) gpu {
	g.healthy = true
	for _, n := range p.nodes(g) {
		if st := devfs.Stat(p.opts.DevRoot, n); !st.Accessible {
			g.healthy, g.reason = false, fmt.Sprint(st.Err)
			return g
		}
	}
	if g.RenderNode == "" {
		g.healthy, g.reason = false, "no DRM render node"
	}
	if want := p.cfg.ComputePartition; want != "" && g.ComputePartition != "" && g.ComputePartition != want {
		g.healthy, g.reason = false, fmt.Sprintf("compute partition is %s, want %s", g.ComputePartition, want)
	}
	return g
}

// nodes are the device nodes a container needs for g.
func (p *Plugin) nodes(g gpu) []string {
	out := []string{amd.KFDNode}
	if g.RenderNode != "" {
		out = append(out, g.RenderNode)
	}
	if g.CardNode != "" && !p.cfg.OmitCardNodes {
		out = append(out, g.CardNode)
	}
	return out
}

// Allocate gives /dev/kfd once plus every GPU's render and card nodes.
func (p *Plugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	resp := &pluginapi.ContainerAllocateResponse{}
	seen := make(map[string]bool)
	for _, id := range ids {
		g, ok := p.gpus[id]
		if !ok || !g.present {
			return nil, fmt.Errorf("GPU %s is no longer present", id)
		}
		for _, n := range p.nodes(g) {
			if seen[n] {
				continue
			}
			seen[n] = true
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: n, HostPath: n, Permissions: "rw"})
		}
	}
	return resp, nil
}

// PreferredAllocation packs the request onto as few NUMA nodes as
// possible.
func (p *Plugin) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	return deviceplugin.PackNUMA(req), nil
}
