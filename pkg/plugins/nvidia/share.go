package nvidia

import (
	"fmt"
	"strings"

	"github.com/dpkit/dpkit/pkg/deviceplugin"
	nv "github.com/dpkit/dpkit/pkg/discovery/nvidia"
	"github.com/dpkit/dpkit/pkg/plugins"
)

// Memory shares (Config.Shared, Config.Replicas): a GPU whose memory is
// known is a shared device whose capacity memory DRA claims take shares
// of, and each time-slicing replica is a fixed share of it.

// CapacityMemory is the capacity a GPU publishes its memory as, and the
// one its shares take.
const CapacityMemory = "memory"

// replicaPolicy is how a share asks for memory when replicas share a GPU
// and Shared does not say.
var replicaPolicy = plugins.SharePolicy{Min: "1Mi", Step: "1Mi"}

// memoryOf returns g's memory in bytes: the size its model name carries,
// or else Config.Memory; 0 when neither gives it.
func (p *Plugin) memoryOf(g nv.GPU) int64 {
	if v, ok := nv.MemoryOf(g.Model); ok {
		return v
	}
	if p.cfg.Memory != "" {
		if v, err := plugins.ParseAmount(p.cfg.Memory); err == nil {
			return v
		}
	}
	return 0
}

// shareOf returns how g's memory (total bytes, 0 when unknown) is shared,
// nil when it is not: sharing is off, or the memory is unknown or too
// small for the policy or the replicas (the reason then says which).
func (p *Plugin) shareOf(g nv.GPU, total int64) (share *deviceplugin.SharedCapacity, reason string) {
	policy, ok := p.cfg.Shared[CapacityMemory]
	switch {
	case ok:
	case p.cfg.Replicas > 1:
		policy = replicaPolicy
	default:
		return nil, ""
	}
	if total == 0 {
		return nil, fmt.Sprintf("its memory is unknown (model %q names none); set nvidia.memory", g.Model)
	}
	c, err := policy.Capacity(total, deviceplugin.FormatAmount(total))
	if err != nil {
		return nil, "shared.memory: " + err.Error()
	}
	if p.cfg.Replicas > 1 && plugins.ReplicaAmount(c, p.cfg.Replicas) < c.Min {
		return nil, fmt.Sprintf("a replica's share of its %s (1/%d) is below the share policy's min", deviceplugin.FormatAmount(total), p.cfg.Replicas)
	}
	return &c, ""
}

// describeShare adds g's memory and, when it is shared, the share that id
// (the GPU or one of its replicas) is. p.mu is held.
func (p *Plugin) describeShare(g gpu, id string, info *deviceplugin.DeviceInfo) {
	if g.memory > 0 && id == g.UUID {
		info.Capacity = map[string]string{CapacityMemory: deviceplugin.FormatAmount(g.memory)}
	}
	if g.share == nil {
		return
	}
	if id == g.UUID {
		if info.Sharing == nil {
			info.Sharing = &deviceplugin.Sharing{}
		}
		info.Sharing.Shared = map[string]deviceplugin.SharedCapacity{CapacityMemory: *g.share}
		return
	}
	if _, rest, ok := strings.Cut(id, ReplicaSeparator); ok && p.cfg.Replicas > 1 && rest != "" {
		info.Sharing = &deviceplugin.Sharing{
			ShareOf:      g.UUID,
			ShareAmounts: map[string]int64{CapacityMemory: plugins.ReplicaAmount(*g.share, p.cfg.Replicas)},
		}
	}
}
