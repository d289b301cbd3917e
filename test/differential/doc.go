// Package differential runs the same device-manager scenarios against
// dpkit's device manager and against the kubelet's own (Kubernetes v1.37.0,
// run standalone by hack/tools/cmd/kubelet-devicemanager) and fails on any
// difference in what they do that is not listed as deliberate.
//
// Both managers run as processes speaking one line protocol:
// cmd/dpkit-devicemanager runs pkg/devicehost (dpkit's device manager and
// plugin watcher, as dpkit kubelet and dpkit node run them), and the
// upstream program runs the kubelet's ManagerImpl, topology manager and
// plugin manager. The test drives both with one client, with the same
// scripted device plugins (pkg/deviceplugin, or raw gRPC where a scenario
// needs a plugin to misbehave) over real unix sockets, and restarts them
// with real signals. See docs/device-manager.md, "Differential suite".
package differential
