// Package fake is a device plugin with made-up devices, for testing
// Kubernetes device plugin flows without hardware: any number of resources
// and devices, ID patterns, a NUMA layout, health that changes over time,
// a preferred-allocation policy and a configurable Allocate answer.
package fake

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// New returns one deviceplugin.Resource per configured resource. cfg must
// have been defaulted and validated.
func New(cfg Config, opts plugins.Options) ([]deviceplugin.Resource, error) {
	return NewWithClock(cfg, opts, clock.RealClock{})
}

// NewWithClock is New with the clock that times health changes.
func NewWithClock(cfg Config, opts plugins.Options, clk clock.WithTicker) ([]deviceplugin.Resource, error) {
	if errs := cfg.Validate(nil); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	opts = opts.Defaults()
	out := make([]deviceplugin.Resource, 0, len(cfg.Resources))
	for _, rc := range cfg.Resources {
		p := &Plugin{cfg: rc, clock: clk, log: opts.Logger.With("plugin", "fake", "resource", rc.Name), index: make(map[string]int, rc.Count), start: clk.Now()}
		for _, f := range rc.Allocate.Failures {
			left := -1
			if f.Count != nil {
				left = *f.Count
			}
			p.failLeft = append(p.failLeft, left)
		}
		for i := range rc.Count {
			p.index[deviceID(rc.IDPattern, i)] = i
		}
		if p.share = rc.sharing(); p.share != nil {
			p.parts = map[string]part{}
			for i := range rc.Count {
				for _, pc := range rc.Partitions {
					for n := range pc.Count {
						p.parts[partitionID(deviceID(rc.IDPattern, i), pc.Profile, n)] = part{parent: i, profile: pc.Profile}
					}
				}
				for n := range rc.Replicas {
					p.parts[replicaID(deviceID(rc.IDPattern, i), n)] = part{parent: i}
				}
			}
		}
		var plugin deviceplugin.Plugin = p
		switch {
		case rc.PreferredAllocation != PreferNone && rc.PreStartRequired:
			plugin = &preferringPreStarter{p}
		case rc.PreferredAllocation != PreferNone:
			plugin = &preferring{p}
		case rc.PreStartRequired:
			plugin = &preStarter{p}
		}
		out = append(out, deviceplugin.Resource{Name: rc.Name, Plugin: plugin})
	}
	return out, nil
}

// Plugin is one fake resource.
type Plugin struct {
	cfg   ResourceConfig
	clock clock.WithTicker
	log   *slog.Logger
	index map[string]int  // device ID -> its number
	share *sharing        // nil: devices are held whole
	parts map[string]part // partition device ID -> what it is

	mu       sync.Mutex
	prestart [][]string
	start    time.Time // the plugin's start, for the scripted failures
	failLeft []int     // calls left to fail per failure; -1: every call
}

// part is one partition device (of a profile) or replica (profile "")
// of device number parent.
type part struct {
	parent  int
	profile string
}

// Scan reports the devices, then applies the health changes as their time
// comes, and returns nil once the last has been reported: the device set
// is then final (deviceplugin.Plugin), and nothing waits for it.
func (p *Plugin) Scan(ctx context.Context, notify func([]deviceplugin.Device)) error {
	rc := p.cfg
	devs := make([]deviceplugin.Device, rc.Count)
	index := make(map[string]int, rc.Count)
	unhealthy := make(map[string]bool, len(rc.Unhealthy))
	for _, id := range rc.Unhealthy {
		unhealthy[id] = true
	}
	for i := range devs {
		id := deviceID(rc.IDPattern, i)
		devs[i] = deviceplugin.Device{ID: id, Healthy: !unhealthy[id]}
		if rc.NUMANodes > 0 {
			devs[i].NUMANodes = []int64{numaNode(i, rc.Count, rc.NUMANodes)}
		}
		index[id] = i
	}
	// Partitions and replicas follow their device: its health, its NUMA
	// node.
	withParts := func(devs []deviceplugin.Device) []deviceplugin.Device {
		if len(rc.Partitions) == 0 && rc.Replicas == 0 {
			return devs
		}
		out := make([]deviceplugin.Device, 0, len(devs)*(1+sumCounts(rc.Partitions)+rc.Replicas))
		for _, d := range devs {
			out = append(out, d)
			for _, pc := range rc.Partitions {
				for n := range pc.Count {
					out = append(out, deviceplugin.Device{ID: partitionID(d.ID, pc.Profile, n), Healthy: d.Healthy, NUMANodes: d.NUMANodes})
				}
			}
			for n := range rc.Replicas {
				out = append(out, deviceplugin.Device{ID: replicaID(d.ID, n), Healthy: d.Healthy, NUMANodes: d.NUMANodes})
			}
		}
		return out
	}
	// Times count from before the first report, so a clock that moves
	// right after it cannot be missed.
	start := p.clock.Now()
	p.mu.Lock()
	p.start = start
	p.mu.Unlock()
	notify(withParts(devs))

	for _, hc := range rc.schedule() {
		wait := hc.After.Duration - p.clock.Since(start)
		if wait > 0 {
			t := p.clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C():
			}
		}
		devs = slices.Clone(devs)
		devs[index[hc.Device]].Healthy = hc.Health == pluginapi.Healthy
		p.log.Info("Health changed", "device", hc.Device, "health", hc.Health)
		notify(withParts(devs))
	}
	// The schedule has run: the device set is final. Returning says so
	// and holds no goroutine for it (a process of a thousand simulated
	// nodes runs a thousand fakes).
	return nil
}

var _ deviceplugin.Describer = (*Plugin)(nil)

// Describe returns the configured attributes and capacity of device id,
// with the attribute index, the device's number.
func (p *Plugin) Describe(id string) (deviceplugin.DeviceInfo, bool) {
	i, whole := p.index[id]
	pt, isPart := p.parts[id]
	if !whole && !isPart {
		return deviceplugin.DeviceInfo{}, false
	}
	if isPart {
		i = pt.parent
		if pt.profile == "" {
			// A replica: a fixed share of its device, for the device
			// plugin front only.
			return deviceplugin.DeviceInfo{Sharing: &deviceplugin.Sharing{
				ShareOf: deviceID(p.cfg.IDPattern, i), ShareAmounts: maps.Clone(p.share.replica),
			}}, true
		}
	}
	info := deviceplugin.DeviceInfo{Attributes: make(map[string]deviceplugin.Attribute, len(p.cfg.Attributes)+3)}
	for name, v := range p.cfg.Attributes {
		info.Attributes[name] = v.Attribute
	}
	info.Attributes[IndexAttribute] = deviceplugin.IntAttr(int64(i))
	if len(p.cfg.Capacity) > 0 {
		info.Capacity = maps.Clone(p.cfg.Capacity)
	}
	if p.share == nil {
		return info, true
	}
	set := deviceID(p.cfg.IDPattern, i)
	if len(p.cfg.Partitions) > 0 {
		info.Attributes[PartitionAttribute] = deviceplugin.BoolAttr(isPart)
	}
	if !isPart {
		info.Sharing = of(p.share.whole, set)
		return info, true
	}
	// A partition has what it takes of the device's capacities.
	info.Attributes[ProfileAttribute] = deviceplugin.StringAttr(pt.profile)
	info.Attributes[ParentAttribute] = deviceplugin.StringAttr(set)
	for _, pc := range p.cfg.Partitions {
		if pc.Profile == pt.profile {
			info.Capacity = maps.Clone(pc.Consumes)
		}
	}
	info.Sharing = of(p.share.partitions[pt.profile], set)
	return info, true
}

// Allocate answers with the configured response.
func (p *Plugin) Allocate(_ context.Context, ids []string) (*pluginapi.ContainerAllocateResponse, error) {
	a := p.cfg.Allocate
	if a.Error != "" {
		return nil, errors.New(a.Error)
	}
	if err := p.scriptedFailure(); err != nil {
		return nil, err
	}
	joined := strings.Join(ids, ",")
	expand := func(s string) string { return strings.ReplaceAll(s, "{ids}", joined) }
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{EnvDevices: joined}}
	for k, v := range a.Envs {
		resp.Envs[k] = expand(v)
	}
	for _, m := range a.Mounts {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: expand(m.ContainerPath), HostPath: expand(m.HostPath), ReadOnly: m.ReadOnly})
	}
	for _, d := range a.Devices {
		for _, id := range perDevice(ids, d.ContainerPath+d.HostPath) {
			resp.Devices = append(resp.Devices, &pluginapi.DeviceSpec{
				ContainerPath: expandID(expand(d.ContainerPath), id), HostPath: expandID(expand(d.HostPath), id), Permissions: d.Permissions,
			})
		}
	}
	for _, name := range a.CDIDevices {
		for _, id := range perDevice(ids, name) {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: expandID(expand(name), id)})
		}
	}
	if len(a.Annotations) > 0 {
		resp.Annotations = make(map[string]string, len(a.Annotations))
		for k, v := range a.Annotations {
			resp.Annotations[k] = expand(v)
		}
	}
	return resp, nil
}

// scriptedFailure returns the error of the first configured failure whose
// time has come and that has calls left, counting the call.
func (p *Plugin) scriptedFailure() error {
	failures := p.cfg.Allocate.Failures
	if len(failures) == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	since := p.clock.Since(p.start)
	for i, f := range failures {
		if since < f.After.Duration || p.failLeft[i] == 0 {
			continue
		}
		if p.failLeft[i] > 0 {
			p.failLeft[i]--
		}
		p.log.Info("Allocate fails as scripted", "failure", i, "message", f.Message)
		return errors.New(f.Message)
	}
	return nil
}

// perDevice returns ids when s has a per-device placeholder, and a single
// empty entry otherwise.
func perDevice(ids []string, s string) []string {
	if strings.Contains(s, "{id}") || strings.Contains(s, "{index}") {
		return ids
	}
	return []string{""}
}

func expandID(s, id string) string {
	if id == "" {
		return s
	}
	s = strings.ReplaceAll(s, "{id}", id)
	if i := strings.LastIndexFunc(id, func(r rune) bool { return r < '0' || r > '9' }); i < len(id)-1 {
		s = strings.ReplaceAll(s, "{index}", id[i+1:])
	}
	return s
}

func (p *Plugin) preferredAllocation(req deviceplugin.PreferredAllocationRequest) []string {
	if p.cfg.PreferredAllocation == PreferNUMAPacked {
		return deviceplugin.PackNUMA(req)
	}
	out := slices.Clone(req.MustInclude)
	ids := make([]string, 0, len(req.Available))
	for _, d := range req.Available {
		if d.Healthy && !slices.Contains(out, d.ID) {
			ids = append(ids, d.ID)
		}
	}
	slices.SortFunc(ids, deviceplugin.CompareIDs)
	for _, id := range ids {
		if len(out) >= req.Size {
			break
		}
		out = append(out, id)
	}
	return out
}

// PreStarts returns the device lists PreStartContainer was called with.
func (p *Plugin) PreStarts() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.prestart)
}

func (p *Plugin) preStart(ids []string) {
	p.mu.Lock()
	p.prestart = append(p.prestart, ids)
	p.mu.Unlock()
	p.log.Info("PreStartContainer", "devices", ids)
}

// The optional capabilities are offered only when configured, so that
// GetDevicePluginOptions tells the kubelet the truth.
type preferring struct{ *Plugin }

func (p *preferring) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	return p.preferredAllocation(req), nil
}

type preStarter struct{ *Plugin }

func (p *preStarter) PreStartContainer(_ context.Context, ids []string) error {
	p.preStart(ids)
	return nil
}

type preferringPreStarter struct{ *Plugin }

func (p *preferringPreStarter) PreferredAllocation(_ context.Context, req deviceplugin.PreferredAllocationRequest) ([]string, error) {
	return p.preferredAllocation(req), nil
}

func (p *preferringPreStarter) PreStartContainer(_ context.Context, ids []string) error {
	p.preStart(ids)
	return nil
}
