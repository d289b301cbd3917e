// Package podruntime is the kubelet's pod lifecycle as the virtual node's
// backends share it: what a kubelet decides about a pod between
// admission and the container runtime, written once. It holds the
// kubelet's pod worker (Worker), its words (event reasons, container
// state reasons and the messages that go with them), which init
// containers are sidecars, the restart policy and its back-off, the grace
// period of a deletion or a kill, a container's environment and $(VAR)
// expansion, the set of pod workers, the pod status computed from the
// containers' states (phase, conditions, started and ready), the prober
// (its workers, thresholds and exec, HTTP, TCP and gRPC probes, against a
// ProbeTarget), the lifecycle hooks (Hook), the pod's DNS configuration
// and hostname (DNS) and termination messages. Package crilog below it
// reads CRI log files.
//
// A Worker runs one pod, as the kubelet's pod worker and SyncPod, on a
// Runner, which only starts, stops, execs and observes containers. The
// process and cri backends are Runners; the sim backend, which runs
// nothing, takes the statuses from this package in one step. Package
// backend is the backends' contract with the node. The name is the
// kubelet's split: the container runtime runs containers, the pod
// runtime runs pods on it.
package podruntime
