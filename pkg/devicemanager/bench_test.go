package devicemanager

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/pkg/devicemanager/checkpoint"
)

// inProcessPlugin answers Allocate without any transport, so benchmarks
// measure the manager and not gRPC.
type inProcessPlugin struct {
	pluginapi.DevicePluginClient
	resp *pluginapi.AllocateResponse
}

func (p inProcessPlugin) Allocate(context.Context, *pluginapi.AllocateRequest, ...grpc.CallOption) (*pluginapi.AllocateResponse, error) {
	return p.resp, nil
}

func benchDevices(n int) []*pluginapi.Device {
	out := make([]*pluginapi.Device, n)
	for i := range out {
		out[i] = &pluginapi.Device{ID: fmt.Sprintf("dev-%06d", i), Health: pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(i % 2)}}}}
	}
	return out
}

// benchManager returns a manager with one resource of n devices served by
// an in-process plugin, without sockets or goroutines.
func benchManager(b testing.TB, n int, policy string, withCheckpoint bool) (*Manager, *endpoint) {
	b.Helper()
	dir := b.TempDir()
	m, err := New(Config{Root: dir, TopologyPolicy: policy, NUMANodes: []int{0, 1}})
	if err != nil {
		b.Fatal(err)
	}
	if err := mkdirAll(PluginDir(dir)); err != nil {
		b.Fatal(err)
	}
	m.skipCheckpoint = !withCheckpoint
	m.started = true
	e := &endpoint{resource: res, socket: "in-process", api: inProcessPlugin{resp: &pluginapi.AllocateResponse{
		ContainerResponses: []*pluginapi.ContainerAllocateResponse{{Envs: map[string]string{"X": "y"}}}}},
		opts: &pluginapi.DevicePluginOptions{}}
	r := newResourceState(res)
	r.endpoints[e.socket], r.primary = e, e
	m.resources[res] = r
	m.applyDevices(e, benchDevices(n))
	return m, e
}

// BenchmarkAdmit measures one pod admission (one container, one device)
// followed by its removal, with an in-process plugin.
func BenchmarkAdmit(b *testing.B) {
	for _, n := range []int{8, 1000, 100000} {
		for _, policy := range []string{"none", "best-effort"} {
			b.Run(fmt.Sprintf("devices=%d/policy=%s", n, policy), func(b *testing.B) {
				m, _ := benchManager(b, n, policy, false)
				pods := make([]*corev1Pod, 64)
				for i := range pods {
					pods[i] = makePod(fmt.Sprint("p", i), c("app", 1))
				}
				// Hold half the devices so selection works on a busy resource.
				for i := 0; i < n/2; i++ {
					if _, err := m.Admit(context.Background(), makePod(fmt.Sprint("hold", i), c("app", 1))); err != nil {
						b.Fatal(err)
					}
					if i > 2000 {
						break
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					p := pods[i%len(pods)]
					if _, err := m.Admit(context.Background(), p); err != nil {
						b.Fatal(err)
					}
					m.RemovePod(p.UID)
				}
			})
		}
	}
}

// BenchmarkAdmitWithCheckpoint is BenchmarkAdmit including the two
// checkpoint writes (admit and remove), each with fsync.
func BenchmarkAdmitWithCheckpoint(b *testing.B) {
	for _, n := range []int{8, 1000, 100000} {
		b.Run(fmt.Sprintf("devices=%d", n), func(b *testing.B) {
			m, _ := benchManager(b, n, "none", true)
			p := makePod("p", c("app", 1))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := m.Admit(context.Background(), p); err != nil {
					b.Fatal(err)
				}
				m.RemovePod(p.UID)
			}
		})
	}
}

// BenchmarkListAndWatchUpdate applies a ListAndWatch message of n devices
// in which one device changes health: the accounting alone, and with the
// checkpoint write that follows every message (as in the kubelet).
func BenchmarkListAndWatchUpdate(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		for _, withCheckpoint := range []bool{false, true} {
			b.Run(fmt.Sprintf("devices=%d/checkpoint=%v", n, withCheckpoint), func(b *testing.B) {
				m, e := benchManager(b, n, "none", withCheckpoint)
				msgs := [2][]*pluginapi.Device{benchDevices(n), benchDevices(n)}
				msgs[1][n/2] = &pluginapi.Device{ID: msgs[1][n/2].ID, Health: pluginapi.Unhealthy}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					m.applyDevices(e, msgs[i%2])
				}
			})
		}
	}
}

// BenchmarkCheckpointWrite writes a checkpoint with entries pods of one
// device each and a resource of registered healthy devices.
func BenchmarkCheckpointWrite(b *testing.B) {
	for _, tc := range []struct{ entries, registered int }{{10, 8}, {100, 1000}, {1000, 100000}} {
		b.Run(fmt.Sprintf("entries=%d/registered=%d", tc.entries, tc.registered), func(b *testing.B) {
			cp := checkpoint.Checkpoint{Registered: map[string][]string{res: nil}}
			for i := 0; i < tc.registered; i++ {
				cp.Registered[res] = append(cp.Registered[res], fmt.Sprintf("dev-%06d", i))
			}
			for i := 0; i < tc.entries; i++ {
				cp.Entries = append(cp.Entries, checkpoint.PodDevicesEntry{PodUID: fmt.Sprintf("pod-%d", i), ContainerName: "app", ResourceName: res,
					DeviceIDs: checkpoint.DevicesPerNUMA{0: {fmt.Sprintf("dev-%06d", i)}}, AllocResp: []byte("\n\x06\n\x01X\x12\x01y")})
			}
			path := filepath.Join(b.TempDir(), checkpoint.FileName)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := checkpoint.Write(path, cp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
