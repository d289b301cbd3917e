// Package nvidia is a device plugin for NVIDIA GPUs that needs neither cgo
// nor the NVIDIA management library. It discovers GPUs from the driver's
// procfs (see pkg/discovery/nvidia), reports each GPU's NUMA node, tells a
// container its GPUs through NVIDIA_VISIBLE_DEVICES, device nodes or CDI
// names, can share GPUs by time-slicing (replica IDs <UUID>::<n>) and
// prefers allocations that span few NUMA nodes.
//
// Health comes from device presence: a GPU is unhealthy while
// /dev/nvidiactl or its /dev/nvidia<minor> is missing or unreadable, while
// the driver reports it excluded, and after it vanished from
// /proc/driver/nvidia/gpus (fell off the bus). A HealthChecker (for
// example one fed by NVML Xid events, loaded at run time) can add to that
// through NewWithHealthChecker; none ships with dpkit because loading
// libnvidia-ml.so.1 without cgo is not possible cleanly.
package nvidia

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/discovery/devfs"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	nv "github.com/dpkit/dpkit/pkg/discovery/nvidia"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// EnvVisibleDevices is the variable the NVIDIA container runtime reads.
const EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"

// ReplicaSeparator joins a GPU UUID and a replica number in replica IDs.
const ReplicaSeparator = "::"

// HealthChecker reports GPU health beyond device presence, such as NVML's
// critical Xid events. Run watches gpus until ctx is done and calls report
// whenever a GPU's health changes; a GPU reported unhealthy stays so until
// reported healthy again.
type HealthChecker interface {
	Run(ctx context.Context, gpus []nv.GPU, report func(uuid string, healthy bool, reason string)) error
}

// New returns the nvidia resource with presence-based health. cfg must
// have been defaulted; it is validated here.
func New(cfg Config, opts plugins.Options) ([]deviceplugin.Resource, error) {
	return NewWithHealthChecker(cfg, opts, nil)
}

// NewWithHealthChecker is New with an additional health source (nil for
// none).
func NewWithHealthChecker(cfg Config, opts plugins.Options, hc HealthChecker) ([]deviceplugin.Resource, error) {
	if errs := cfg.Validate(nil); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	opts = opts.Defaults()
	p := &Plugin{
		cfg: cfg, opts: opts, hc: hc,
		log:     opts.Logger.With("plugin", "nvidia", "resource", cfg.ResourceName),
		checked: make(map[string]string),
		cdi:     plugins.CDIWriter{Dir: cfg.CDISpecDir},
	}
	return []deviceplugin.Resource{{Name: cfg.ResourceName, Plugin: p}}, nil
}

// Plugin serves NVIDIA GPUs.
type Plugin struct {
	cfg  Config
	opts plugins.Options
	hc   HealthChecker
	log  *slog.Logger

	mu      sync.Mutex
	gpus    map[string]gpu    // by UUID; vanished GPUs stay, unhealthy
	checked map[string]string // UUID -> reason, from the HealthChecker
	notify  func([]deviceplugin.Device)
	driver  string // the driver's version, "" when unknown

	cdi plugins.CDIWriter // when CDISpecDir is set
}

type gpu struct {
	nv.GPU
	present bool
	reason  string // "" when healthy
	// memory is the GPU's memory in bytes, 0 when unknown.
	memory int64
	// share is how the GPU's memory is shared, nil when it is not.
	share *deviceplugin.SharedCapacity
}

var (
	_ deviceplugin.PreferredAllocator = (*Plugin)(nil)
	_ deviceplugin.Describer          = (*Plugin)(nil)
)

// Scan watches /dev, rereads procfs periodically and runs the health
// checker, if any, once GPUs are known.
func (p *Plugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	p.mu.Lock()
	p.notify = notify
	p.mu.Unlock()
	started := false
	w := &devfs.Watcher{
		Dirs:     []string{p.opts.DevRoot},
		Interval: p.cfg.RescanInterval.Duration,
		Logger:   p.log,
		Rescan: func() {
			gpus := p.rescan()
			if p.cfg.CDISpecDir != "" {
				if err := p.cdi.Write(p.cdiSpec()); err != nil {
					p.log.Error("Cannot write CDI spec", "dir", p.cfg.CDISpecDir, "err", err)
				}
			}
			notify(p.snapshot())
			if p.hc != nil && !started && len(gpus) > 0 {
				started = true
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := p.hc.Run(ctx, gpus, p.report); err != nil && ctx.Err() == nil {
						p.log.Error("GPU health checker stopped; health now comes from device presence only", "err", err)
					}
				}()
			}
		},
	}
	err := w.Run(ctx)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (p *Plugin) report(uuid string, healthy bool, reason string) {
	p.mu.Lock()
	if healthy {
		delete(p.checked, uuid)
	} else {
		p.checked[uuid] = cmpOr(reason, "reported unhealthy")
	}
	notify := p.notify
	p.mu.Unlock()
	p.log.Info("GPU health changed", "uuid", uuid, "healthy", healthy, "reason", reason)
	if notify != nil {
		notify(p.snapshot())
	}
}

func (p *Plugin) rescan() []nv.GPU {
	found, err := nv.Scan(p.opts.ProcRoot, p.opts.SysfsRoot)
	if err != nil {
		p.log.Warn("Cannot read /proc/driver/nvidia", "err", err)
	}
	driver, err := nv.DriverVersion(p.opts.ProcRoot)
	if err != nil && len(found) > 0 {
		p.log.Debug("Driver version unknown", "err", err)
	}
	ctl := devfs.Stat(p.opts.DevRoot, nv.ControlNode)
	p.mu.Lock()
	previous := p.gpus
	p.mu.Unlock()
	current := make(map[string]gpu, len(found))
	for _, g := range found {
		c := gpu{GPU: g, present: true}
		switch {
		case g.Excluded:
			c.reason = "excluded by the driver"
		case !ctl.Accessible:
			c.reason = fmt.Sprint(ctl.Err)
		case g.Node() == "":
			c.reason = "device minor unknown"
		default:
			if st := devfs.Stat(p.opts.DevRoot, g.Node()); !st.Accessible {
				c.reason = fmt.Sprint(st.Err)
			}
		}
		c.memory = p.memoryOf(g)
		var why string
		if c.share, why = p.shareOf(g, c.memory); why != "" {
			if old, seen := previous[g.UUID]; !seen || old.share != nil {
				p.log.Warn("GPU not shared", "uuid", g.UUID, "reason", why)
			}
		}
		current[g.UUID] = c
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for uuid, old := range p.gpus {
		if _, ok := current[uuid]; !ok {
			old.present, old.reason = false, "GPU vanished from /proc/driver/nvidia/gpus"
			current[uuid] = old
		}
	}
	p.gpus = current
	p.driver = driver
	return found
}

// Describe returns what the driver's procfs says about the GPU behind id
// (a UUID, or a replica of one when time-sliced): its PCI address and the
// attributes productName, uuid, minor and driverVersion, each only when
// known, and the capacity memory when the model name or Config.Memory
// gives it.
func (p *Plugin) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.gpus[GPUOf(id)]
	if !ok || !slices.Contains(p.ids(g), id) {
		return deviceplugin.DeviceInfo{}, false
	}
	info := deviceplugin.DeviceInfo{
		PCIBusID:   g.BusID,
		Attributes: map[string]deviceplugin.Attribute{"uuid": deviceplugin.StringAttr(g.UUID)},
	}
	if g.Model != "" {
		info.Attributes["productName"] = deviceplugin.StringAttr(g.Model)
	}
	if g.Minor >= 0 {
		info.Attributes["minor"] = deviceplugin.IntAttr(int64(g.Minor))
	}
	if p.driver != "" {
		info.Attributes["driverVersion"] = plugins.VersionAttr(p.driver)
	}
	p.describeMIG(g, id, &info)
	p.describeShare(g, id, &info)
	return info, true
}

// cdiSpec is the CDI spec of the GPUs present: one device per UUID with
// its /dev/nvidia<minor>, the control, UVM and modeset nodes for every
// device. Each node carries its type and numbers, as read below the dev
// root, so the runtime needs not find it at its host path (true on a
// real host, where the dev root is the host's /dev).
func (p *Plugin) cdiSpec() cdispec.Spec {
	node := func(path string) *cdispec.DeviceNode {
		n := &cdispec.DeviceNode{Path: path, HostPath: path, Permissions: "rw"}
		if st := devfs.Stat(p.opts.DevRoot, path); st.Char {
			n.Type, n.Major, n.Minor = "c", int64(st.Major), int64(st.Minor)
		}
		return n
	}
	spec := cdispec.Spec{Version: plugins.CDIVersion, Kind: p.cfg.CDIKind, Devices: []cdispec.Device{}}
	spec.ContainerEdits.DeviceNodes = []*cdispec.DeviceNode{node(nv.ControlNode)}
	for _, n := range append(nv.UVMNodes(), nv.ModesetNode) {
		if devfs.Stat(p.opts.DevRoot, n).Exists {
			spec.ContainerEdits.DeviceNodes = append(spec.ContainerEdits.DeviceNodes, node(n))
		}
	}
	p.mu.Lock()
	gpus := make([]gpu, 0, len(p.gpus))
	for _, g := range p.gpus {
		if g.present && g.Node() != "" {
			gpus = append(gpus, g)
		}
	}
	p.mu.Unlock()
	slices.SortFunc(gpus, func(a, b gpu) int { return strings.Compare(a.BusID, b.BusID) })
	for _, g := range gpus {
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           g.UUID,
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node(g.Node())}},
		})
	}
	return spec
}

// snapshot lists every GPU, or Replicas IDs per GPU, in bus order.
func (p *Plugin) snapshot() []deviceplugin.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	gpus := make([]gpu, 0, len(p.gpus))
	for _, g := range p.gpus {
		gpus = append(gpus, g)
	}
	slices.SortFunc(gpus, func(a, b gpu) int { return strings.Compare(a.BusID, b.BusID) })
	out := make([]deviceplugin.Device, 0, len(gpus)*p.cfg.Replicas)
	for _, g := range gpus {
		reason := g.reason
		if reason == "" {
			reason = p.checked[g.UUID]
		}
		if reason != "" {
			p.log.Debug("GPU unhealthy", "uuid", g.UUID, "bus", g.BusID, "reason", reason)
		}
		for _, id := range p.ids(g) {
			out = append(out, deviceplugin.Device{ID: id, Healthy: reason == "", NUMANodes: numa.Nodes(g.NUMANode)})
		}
	}
	return out
}

// ids returns the IDs advertised for a GPU: its UUID, or its replicas
// <UUID>::0 ... when time-sliced (and its UUID before them when its
// memory is shared: the replicas are shares of it); with MIG partitions,
// its UUID and its partitions <UUID>::<profile>-<n>.
func (p *Plugin) ids(g gpu) []string {
	if l, ok := p.migLayout(g); ok {
		out := []string{g.UUID}
		for _, pr := range l.Profiles {
			for n := range pr.Instances {
				out = append(out, migID(g.UUID, pr.Name, n))
			}
		}
		return out
	}
	ids := plugins.Sharing{N: p.cfg.Replicas, Sep: ReplicaSeparator}.IDs(g.UUID)
	if g.share != nil && p.cfg.Replicas > 1 {
		return append([]string{g.UUID}, ids...)
	}
	return ids
}

// GPUOf returns the UUID behind a device or replica ID. Unlike
// plugins.Sharing.Device it needs no replica count: a GPU UUID never holds
// "::".
func GPUOf(id string) string {
	uuid, _, _ := strings.Cut(id, ReplicaSeparator)
	return uuid
}

// Allocate maps the IDs (replicas included) back to their GPUs and
// answers with every configured strategy.
func (p *Plugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	if p.cfg.FailRequestsGreaterThanOne && len(ids) > 1 {
		return nil, status.Errorf(codes.InvalidArgument,
			"request for %d %s replicas refused: time-sliced GPUs are shared, more than one replica gives no more GPU time (failRequestsGreaterThanOne is set)",
			len(ids), p.cfg.ResourceName)
	}
	p.mu.Lock()
	var gpus []gpu
	seen := make(map[string]bool)
	for _, id := range ids {
		uuid := GPUOf(id)
		if seen[uuid] {
			continue
		}
		seen[uuid] = true
		g, ok := p.gpus[uuid]
		if !ok || !g.present {
			p.mu.Unlock()
			return nil, fmt.Errorf("GPU %s is no longer present", uuid)
		}
		gpus = append(gpus, g)
	}
	p.mu.Unlock()
	resp := &pluginapi.ContainerAllocateResponse{}
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	for _, s := range p.cfg.DeviceListStrategy {
		switch s {
		case StrategyEnvvar:
			resp.Envs = map[string]string{EnvVisibleDevices: strings.Join(uuids, ",")}
		case StrategyDeviceSpecs:
			nodes := []string{nv.ControlNode}
			for _, n := range append(nv.UVMNodes(), nv.ModesetNode) {
				if devfs.Stat(p.opts.DevRoot, n).Exists {
					nodes = append(nodes, n)
				}
			}
			for _, g := range gpus {
				nodes = append(nodes, g.Node())
			}
			for _, n := range nodes {
				resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{ContainerPath: n, HostPath: n, Permissions: "rw"})
			}
		case StrategyCDI:
			for _, u := range uuids {
				resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: p.cfg.CDIKind + "=" + u})
			}
		}
	}
	return resp, nil
}

// PreferredAllocation packs the request onto as few NUMA nodes as
// possible; with time-slicing it spreads replicas over GPUs.
func (p *Plugin) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	p.mu.Lock()
	bus := make(map[string]string, len(p.gpus))
	for u, g := range p.gpus {
		bus[u] = g.BusID
	}
	p.mu.Unlock()
	// Bus order, then replica number: GPU 0 before GPU 1 on a node.
	req.Available = slices.Clone(req.Available)
	slices.SortStableFunc(req.Available, func(a, b deviceplugin.Device) int {
		if c := strings.Compare(bus[GPUOf(a.ID)], bus[GPUOf(b.ID)]); c != 0 {
			return c
		}
		return deviceplugin.CompareIDs(a.ID, b.ID)
	})
	var group func(string) string
	if p.cfg.Replicas > 1 {
		group = GPUOf
	}
	return deviceplugin.PackNUMAGroups(req, group), nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
