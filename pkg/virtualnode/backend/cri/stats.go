package cri

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
	"github.com/dpkit/dpkit/pkg/virtualnode/podruntime"
)

var _ backend.StatsProvider = (*Backend)(nil)

// cpuCachePeriod is how long a CPU sample is kept to compute the next
// one's usage in nano cores (the kubelet's defaultCachePeriod).
const cpuCachePeriod = 10 * time.Minute

// cpuSample is the last CPU sample of a container or sandbox and the
// usage computed from the one before it (the kubelet's cpuUsageRecord).
type cpuSample struct {
	stats          *runtimeapi.CpuUsage
	usageNanoCores *uint64
}

// cpuCache computes usage in nano cores from successive samples for
// runtimes that give only the cumulative CPU time.
type cpuCache struct {
	mu sync.Mutex
	m  map[string]*cpuSample
}

// nanoCores returns the runtime's usage in nano cores, or computes it from
// the previous sample of id, as the kubelet's
// getAndUpdateContainerUsageNanoCores: nil on the first sample, after a
// reset of the counter, or when the runtime gives no CPU time.
func (c *cpuCache) nanoCores(id string, cpu *runtimeapi.CpuUsage) *uint64 {
	if cpu == nil {
		return nil
	}
	if cpu.UsageNanoCores != nil {
		v := cpu.UsageNanoCores.Value
		return &v
	}
	if cpu.UsageCoreNanoSeconds == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*cpuSample{}
	}
	prev, ok := c.m[id]
	if !ok || prev.stats.UsageCoreNanoSeconds == nil || cpu.UsageCoreNanoSeconds.Value < prev.stats.UsageCoreNanoSeconds.Value {
		c.m[id] = &cpuSample{stats: cpu}
		return nil
	}
	if cpu.Timestamp <= prev.stats.Timestamp {
		// The same sample again: the usage computed last time.
		if prev.usageNanoCores == nil {
			return nil
		}
		v := *prev.usageNanoCores
		return &v
	}
	v := uint64(float64(cpu.UsageCoreNanoSeconds.Value-prev.stats.UsageCoreNanoSeconds.Value) /
		float64(cpu.Timestamp-prev.stats.Timestamp) * float64(time.Second))
	c.m[id] = &cpuSample{stats: cpu, usageNanoCores: &v}
	out := v
	return &out
}

// prune drops samples older than cpuCachePeriod, as the kubelet's
// cleanupOutdatedCaches.
func (c *cpuCache) prune(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, s := range c.m {
		if now.Sub(time.Unix(0, s.stats.Timestamp)) > cpuCachePeriod {
			delete(c.m, id)
		}
	}
}

// PodStats implements backend.StatsProvider from the runtime's own
// measures, as the kubelet's CRI stats provider with
// PodAndContainerStatsFromCRI: ListPodSandboxStats for the pod's CPU,
// memory and network and its running containers' CPU and memory. When
// the runtime cannot answer it (Unimplemented, or containerd's "has no
// cgroup parent": the backend leaves sandboxes in the runtime's default
// cgroup), ListContainerStats instead, the pod's CPU and memory the sums
// of its containers', as the kubelet's addPodCPUMemoryStats without
// cAdvisor, and no network stats. Usage in nano cores is the runtime's, or computed from the
// previous sample as the kubelet does.
func (b *Backend) PodStats(ctx context.Context) ([]statsv1alpha1.PodStats, error) {
	byID := map[string]*runtimeapi.PodSandboxStats{}
	resp, err := b.rt.ListPodSandboxStats(b.logctx(ctx), &runtimeapi.PodSandboxStatsFilter{
		LabelSelector: map[string]string{LabelNode: b.cfg.Node},
	})
	if err == nil {
		for _, s := range resp {
			if id := s.GetAttributes().GetId(); id != "" {
				byID[id] = s
			}
		}
	} else {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if status.Code(err) != codes.Unimplemented {
			// containerd measures a pod from its sandbox's cgroup parent,
			// which the backend does not set ("has no cgroup parent").
			b.log.Debug("Pod sandbox stats, reading container stats instead", "err", err)
		}
		cs, err := b.rt.ListContainerStats(b.logctx(ctx), &runtimeapi.ContainerStatsFilter{
			LabelSelector: map[string]string{LabelNode: b.cfg.Node},
		})
		if err != nil {
			return nil, fmt.Errorf("cri backend: container stats: %w", err)
		}
		// ListContainerStats names no sandbox: every pod looks for its
		// containers, by ID, among all of them.
		byID[""] = &runtimeapi.PodSandboxStats{Linux: &runtimeapi.LinuxPodSandboxStats{Containers: cs}}
	}
	b.cpu.prune(time.Now())

	prs := b.pods.All()
	var out []statsv1alpha1.PodStats
	for _, pr := range prs {
		pr.mu.Lock()
		sandboxID := pr.sandboxID
		pr.mu.Unlock()
		ps := statsv1alpha1.PodStats{
			PodRef: statsv1alpha1.PodReference{Name: pr.pod.Name, Namespace: pr.pod.Namespace, UID: string(pr.pod.UID)},
		}
		if t := pr.w.StartTime(); t != nil {
			ps.StartTime = *t
		}
		// The running containers, by runtime ID (the kubelet's
		// removeTerminatedContainers).
		running := map[string]podruntime.ContainerRun{}
		for _, c := range pr.w.Containers() {
			if c.Running {
				running[c.ID] = c
			}
		}
		if sandboxID == "" {
			continue
		}
		sb := byID[sandboxID]
		if sb == nil {
			sb = byID[""]
		}
		if sb == nil {
			continue
		}
		for _, cs := range sb.GetLinux().GetContainers() {
			id := cs.GetAttributes().GetId()
			c, ok := running[id]
			if !ok {
				continue
			}
			ps.Containers = append(ps.Containers, b.containerStats(c.Name, c.StartedAt, cs))
		}
		if l := sb.GetLinux(); l != nil && l.Cpu != nil {
			ps.CPU = &statsv1alpha1.CPUStats{
				Time:                 metav1.NewTime(time.Unix(0, l.Cpu.Timestamp)),
				UsageNanoCores:       b.cpu.nanoCores(sandboxID, l.Cpu),
				UsageCoreNanoSeconds: uint64Value(l.Cpu.UsageCoreNanoSeconds),
			}
		}
		if l := sb.GetLinux(); l != nil && l.Memory != nil {
			ps.Memory = memoryStats(l.Memory)
		}
		if ps.CPU == nil || ps.Memory == nil {
			sumContainers(&ps)
		}
		if n := sb.GetLinux().GetNetwork(); n != nil {
			ps.Network = networkStats(n)
		}
		if ps.CPU == nil && ps.Memory == nil && len(ps.Containers) == 0 {
			continue
		}
		out = append(out, ps)
	}
	return out, nil
}

// containerStats is one container's CPU and memory, as the kubelet's
// makeContainerStats: zeros where the runtime gives nothing.
func (b *Backend) containerStats(name string, started time.Time, s *runtimeapi.ContainerStats) statsv1alpha1.ContainerStats {
	now := time.Now()
	cs := statsv1alpha1.ContainerStats{Name: name, StartTime: metav1.NewTime(started)}
	if cpu := s.GetCpu(); cpu != nil {
		cs.CPU = &statsv1alpha1.CPUStats{
			Time:                 metav1.NewTime(time.Unix(0, cpu.Timestamp)),
			UsageNanoCores:       b.cpu.nanoCores(s.GetAttributes().GetId(), cpu),
			UsageCoreNanoSeconds: uint64Value(cpu.UsageCoreNanoSeconds),
		}
	} else {
		var zero uint64
		cs.CPU = &statsv1alpha1.CPUStats{Time: metav1.NewTime(now), UsageCoreNanoSeconds: &zero, UsageNanoCores: new(uint64)}
	}
	if m := s.GetMemory(); m != nil {
		cs.Memory = memoryStats(m)
	} else {
		cs.Memory = &statsv1alpha1.MemoryStats{Time: metav1.NewTime(now), WorkingSetBytes: new(uint64), UsageBytes: new(uint64), RSSBytes: new(uint64)}
	}
	return cs
}

func memoryStats(m *runtimeapi.MemoryUsage) *statsv1alpha1.MemoryStats {
	return &statsv1alpha1.MemoryStats{
		Time:            metav1.NewTime(time.Unix(0, m.Timestamp)),
		AvailableBytes:  uint64Value(m.AvailableBytes),
		UsageBytes:      uint64Value(m.UsageBytes),
		WorkingSetBytes: uint64Value(m.WorkingSetBytes),
		RSSBytes:        uint64Value(m.RssBytes),
		PageFaults:      uint64Value(m.PageFaults),
		MajorPageFaults: uint64Value(m.MajorPageFaults),
	}
}

// sumContainers fills the pod's CPU and memory the runtime did not give
// with the sums of its containers', as the kubelet's addPodCPUMemoryStats.
func sumContainers(ps *statsv1alpha1.PodStats) {
	sumCPU, sumMem := ps.CPU == nil, ps.Memory == nil
	for _, c := range ps.Containers {
		if sumCPU && c.CPU != nil {
			if ps.CPU == nil {
				ps.CPU = &statsv1alpha1.CPUStats{UsageCoreNanoSeconds: new(uint64), UsageNanoCores: new(uint64)}
			}
			ps.CPU.Time = c.CPU.Time
			*ps.CPU.UsageCoreNanoSeconds += deref(c.CPU.UsageCoreNanoSeconds)
			*ps.CPU.UsageNanoCores += deref(c.CPU.UsageNanoCores)
		}
		if sumMem && c.Memory != nil {
			if ps.Memory == nil {
				ps.Memory = &statsv1alpha1.MemoryStats{UsageBytes: new(uint64), WorkingSetBytes: new(uint64), RSSBytes: new(uint64)}
			}
			ps.Memory.Time = c.Memory.Time
			*ps.Memory.UsageBytes += deref(c.Memory.UsageBytes)
			*ps.Memory.WorkingSetBytes += deref(c.Memory.WorkingSetBytes)
			*ps.Memory.RSSBytes += deref(c.Memory.RSSBytes)
		}
	}
}

func networkStats(n *runtimeapi.NetworkUsage) *statsv1alpha1.NetworkStats {
	ns := &statsv1alpha1.NetworkStats{Time: metav1.NewTime(time.Unix(0, n.Timestamp))}
	if n.DefaultInterface != nil {
		ns.InterfaceStats = interfaceStats(n.DefaultInterface)
	}
	for _, i := range n.Interfaces {
		ns.Interfaces = append(ns.Interfaces, interfaceStats(i))
	}
	return ns
}

func interfaceStats(i *runtimeapi.NetworkInterfaceUsage) statsv1alpha1.InterfaceStats {
	return statsv1alpha1.InterfaceStats{
		Name:     i.Name,
		RxBytes:  uint64Value(i.RxBytes),
		RxErrors: uint64Value(i.RxErrors),
		TxBytes:  uint64Value(i.TxBytes),
		TxErrors: uint64Value(i.TxErrors),
	}
}

func uint64Value(v *runtimeapi.UInt64Value) *uint64 {
	if v == nil {
		return nil
	}
	x := v.Value
	return &x
}

func deref(v *uint64) uint64 {
	if v == nil {
		return 0
	}
	return *v
}
