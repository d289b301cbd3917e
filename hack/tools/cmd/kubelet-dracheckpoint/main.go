// Command kubelet-dracheckpoint writes the DRA manager checkpoint
// (dra_manager_state) with the kubelet's own code
// (k8s.io/kubernetes/pkg/kubelet/cm/dra/state, Kubernetes v1.37.0) for a
// fixed set of claims, so dpkit's golden test
// (pkg/dramanager/checkpoint/testdata) holds bytes the kubelet wrote, not
// bytes dpkit believes the kubelet would write.
//
// Usage: go run ./cmd/kubelet-dracheckpoint DIR
// writes DIR/dra_manager_state through the kubelet's checkpointer.
package main

import (
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra/state"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-dracheckpoint DIR")
		os.Exit(2)
	}
	share := types.UID("5ba3c8a4-0b7e-4e5a-9d1c-3f2b1a0c9e8d")
	list := state.ClaimInfoStateList{
		{
			ClaimUID:  "a4f3b2c1-1111-4222-8333-444455556666",
			ClaimName: "gpu-claim",
			Namespace: "default",
			PodUIDs:   sets.New("pod-b", "pod-a"),
			DriverState: map[string]state.DriverState{
				"gpu.example.com": {Devices: []state.Device{
					{PoolName: "node-1", DeviceName: "gpu-0", RequestNames: []string{"gpus"}, CDIDeviceIDs: []string{"example.com/gpu=gpu-0"}},
					{PoolName: "node-1", DeviceName: "gpu-1", RequestNames: []string{"gpus"}, CDIDeviceIDs: []string{"example.com/gpu=gpu-1", "example.com/gpu=common"}},
				}},
				"nic.example.com": {Devices: []state.Device{
					{PoolName: "node-1", DeviceName: "vf-3", ShareID: &share, RequestNames: []string{"nic"}},
				}},
			},
		},
		{
			ClaimUID:  "b5e4c3d2-2222-4333-8444-555566667777",
			ClaimName: "pending-claim",
			Namespace: "team-a",
			PodUIDs:   sets.New("pod-c"),
			DriverState: map[string]state.DriverState{
				"gpu.example.com":  {},
				"skip.example.com": {SkipNodeOperations: []resourceapi.SkipNodeOperation{resourceapi.SkipNodeOperationAll}},
			},
		},
	}
	cp, err := state.NewCheckpointer(os.Args[1], "dra_manager_state")
	if err == nil {
		var c *state.Checkpoint
		c, err = state.NewCheckpoint(list)
		if err == nil {
			err = cp.Store(c)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
