package devicemanager

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// ResourceStatus is one extended resource served by device plugins.
type ResourceStatus struct {
	// Name is the extended resource name, such as "example.com/gpu".
	Name string
	// Capacity counts every device the plugin reported.
	Capacity int64
	// Allocatable counts the healthy devices.
	Allocatable int64
	// InUse counts devices assigned to pods.
	InUse int64
	// Connected reports whether a plugin serves the resource now. A
	// resource without plugin reads zero allocatable until it is removed
	// after the grace period or a plugin registers again.
	Connected bool
}

// Device is one device of a resource.
type Device struct {
	ID        string
	Healthy   bool
	NUMANodes []int64
	// PodUID is the pod holding the device, empty when free.
	PodUID string
}

// PodAllocation lists a pod's devices by container.
type PodAllocation struct {
	PodUID     string
	Containers []ContainerAllocation
}

// ContainerAllocation lists one container's devices by resource.
type ContainerAllocation struct {
	Name      string
	Resources []ResourceAllocation
}

// ResourceAllocation is a container's devices of one resource and the
// plugin's answer for them.
type ResourceAllocation struct {
	Resource string
	// DeviceIDs are sorted.
	DeviceIDs []string
	// NUMANodes maps NUMA node ID to device IDs; -1 holds devices
	// without NUMA information.
	NUMANodes map[int64][]string
	// Response is the plugin's Allocate answer for the container. Callers
	// must not modify it.
	Response *pluginapi.ContainerAllocateResponse
}

// ContainerOptions is what a container runtime needs to give a container
// its devices, merged across the container's resources. It is the one
// type of these options: pkg/devicehost adds the CDI devices of the
// container's claims to it (devicehost.RunOptions), and dpkit kubelet's
// admin API answers it as JSON, hence the tags.
type ContainerOptions struct {
	Envs        []KeyValue   `json:"envs,omitempty"`
	Mounts      []Mount      `json:"mounts,omitempty"`
	Devices     []DeviceSpec `json:"devices,omitempty"`
	Annotations []KeyValue   `json:"annotations,omitempty"`
	// CDIDevices are fully-qualified CDI device names.
	CDIDevices []string `json:"cdiDevices,omitempty"`
}

// KeyValue is an environment variable or annotation.
type KeyValue struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Mount is a bind mount into the container.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// DeviceSpec is a device node made available in the container.
type DeviceSpec struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions,omitempty"`
}
