package process

import (
	"context"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/internal/procfs"
)

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// groupUsage is the summed CPU time and resident memory of a process group.
type groupUsage struct {
	cpu time.Duration
	rss uint64
}

// scanGroups reads /proc once and sums usage per process group.
func scanGroups() map[int]groupUsage {
	out := map[int]groupUsage{}
	page := uint64(os.Getpagesize())
	for _, pid := range procfs.PIDs() {
		st, err := procfs.ReadStat(pid)
		if err != nil {
			continue
		}
		u := out[st.PGRP()]
		u.cpu += time.Duration(st.CPUTicks()) * time.Second / clockTicks
		u.rss += st.RSSPages() * page
		out[st.PGRP()] = u
	}
	return out
}

// PodStats implements backend.StatsProvider: per container, the CPU time
// and resident memory of its process group, read from /proc.
func (b *Backend) PodStats(context.Context) ([]statsv1alpha1.PodStats, error) {
	groups := scanGroups()
	now := metav1.Now()
	prs := b.pods.All()
	var out []statsv1alpha1.PodStats
	for _, pr := range prs {
		ps := statsv1alpha1.PodStats{
			PodRef: statsv1alpha1.PodReference{Name: pr.pod.Name, Namespace: pr.pod.Namespace, UID: string(pr.pod.UID)},
		}
		if t := pr.w.StartTime(); t != nil {
			ps.StartTime = *t
		}
		pr.mu.Lock()
		var podCPU, podMem uint64
		for name, p := range pr.procs {
			if !p.running() {
				continue
			}
			u := groups[p.pid]
			cpu := uint64(u.cpu.Nanoseconds())
			mem := u.rss
			podCPU += cpu
			podMem += mem
			ps.Containers = append(ps.Containers, statsv1alpha1.ContainerStats{
				Name:      name,
				StartTime: p.started,
				CPU:       &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &cpu},
				Memory:    &statsv1alpha1.MemoryStats{Time: now, RSSBytes: &mem, WorkingSetBytes: &mem},
			})
		}
		pr.mu.Unlock()
		ps.CPU = &statsv1alpha1.CPUStats{Time: now, UsageCoreNanoSeconds: &podCPU}
		ps.Memory = &statsv1alpha1.MemoryStats{Time: now, RSSBytes: &podMem, WorkingSetBytes: &podMem}
		out = append(out, ps)
	}
	return out, nil
}
