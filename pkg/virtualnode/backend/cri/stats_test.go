package cri

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/dpkit/dpkit/pkg/virtualnode/backend"
)

func (f *fakeRuntime) setUsage(u fakeUsage) {
	f.mu.Lock()
	f.usage = u
	f.mu.Unlock()
}

func onePod(t *testing.T, stats []statsv1alpha1.PodStats) statsv1alpha1.PodStats {
	t.Helper()
	if len(stats) != 1 || len(stats[0].Containers) != 1 {
		t.Fatalf("stats %+v, want one pod with one container", stats)
	}
	return stats[0]
}

func value(p *uint64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestPodStats: the pods' stats come from the runtime, ListPodSandboxStats
// when it answers (the pod's own CPU, memory and network), else (it is
// unimplemented, or containerd fails it for want of cgroup parents)
// ListContainerStats with the pod's CPU and memory summed from its
// containers'; usage in nano cores is computed from two samples of the
// cumulative CPU time, as the kubelet does when the runtime gives none.
func TestPodStats(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		podStats bool
		err      codes.Code // ListPodSandboxStats's error without podStats
		factor   uint64     // the pod's usage over its container's
	}{{"sandbox stats", true, codes.OK, 2}, {"unimplemented", false, codes.Unimplemented, 1}, {"no cgroup parent", false, codes.Unknown, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeRuntime(t)
			f.podStats, f.podStatsErr = tc.podStats, tc.err
			rec := newRecorder()
			b := newTestBackend(t, f, rec, backend.Config{}, time.Hour)
			defer b.Close()
			pod := testPod("busy", corev1.RestartPolicyAlways, corev1.Container{Name: "app", Image: "busybox:1", ImagePullPolicy: corev1.PullIfNotPresent})
			if err := b.CreatePod(context.Background(), pod); err != nil {
				t.Fatal(err)
			}
			rec.wait(t, pod.UID, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

			t0 := time.Now()
			f.setUsage(fakeUsage{at: t0, cpuNanoSeconds: 3e9, workingSetBytes: 4 << 20})
			stats, err := b.PodStats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			ps := onePod(t, stats)
			cs := ps.Containers[0]
			if ps.PodRef.Name != "busy" || ps.PodRef.UID != string(pod.UID) || cs.Name != "app" {
				t.Errorf("pod %+v container %q, want busy's app", ps.PodRef, cs.Name)
			}
			if value(cs.CPU.UsageCoreNanoSeconds) != uint64(3e9) || value(cs.Memory.WorkingSetBytes) != uint64(4<<20) || !cs.CPU.Time.Equal(&ps.CPU.Time) {
				t.Errorf("container CPU %v memory %v, want the runtime's 3s and 4MiB", value(cs.CPU.UsageCoreNanoSeconds), value(cs.Memory.WorkingSetBytes))
			}
			if value(ps.CPU.UsageCoreNanoSeconds) != tc.factor*3e9 || value(ps.Memory.WorkingSetBytes) != tc.factor*(4<<20) {
				t.Errorf("pod CPU %v memory %v, want %d times the container's", value(ps.CPU.UsageCoreNanoSeconds), value(ps.Memory.WorkingSetBytes), tc.factor)
			}
			if cs.CPU.UsageNanoCores != nil && *cs.CPU.UsageNanoCores != 0 {
				t.Errorf("first sample: %d nano cores, want none yet", *cs.CPU.UsageNanoCores)
			}
			if tc.podStats && (ps.Network == nil || value(ps.Network.RxBytes) != uint64(7) || value(ps.Network.TxBytes) != uint64(9)) {
				t.Errorf("pod network %+v, want the runtime's eth0", ps.Network)
			}

			// Half a core over two seconds.
			f.setUsage(fakeUsage{at: t0.Add(2 * time.Second), cpuNanoSeconds: 4e9, workingSetBytes: 5 << 20})
			if stats, err = b.PodStats(context.Background()); err != nil {
				t.Fatal(err)
			}
			ps = onePod(t, stats)
			if got := value(ps.Containers[0].CPU.UsageNanoCores); got != uint64(5e8) {
				t.Errorf("container usage %v nano cores, want 5e8", got)
			}
			if got := value(ps.CPU.UsageNanoCores); got != tc.factor*5e8 {
				t.Errorf("pod usage %v nano cores, want %d", got, tc.factor*5e8)
			}

			// A container that exited is not measured.
			f.exit(t, "app", 0)
			rec.wait(t, pod.UID, "waiting to restart", func(p *corev1.Pod) bool { return waitingReason(p, "CrashLoopBackOff") })
			if stats, err = b.PodStats(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, ps := range stats {
				if len(ps.Containers) != 0 {
					t.Errorf("stats of an exited container: %+v", ps.Containers)
				}
			}
		})
	}
}
