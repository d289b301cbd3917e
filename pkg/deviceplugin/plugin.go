// Package deviceplugin is an SDK for Kubernetes device plugins (kubelet
// device plugin API v1beta1).
//
// A plugin author implements Plugin: Scan reports full snapshots of a
// resource's devices, Allocate answers for one container. Preferred
// allocation (PreferredAllocator) and pre-start hooks (PreStarter) are
// optional and found by type assertion; GetDevicePluginOptions is derived
// from what the plugin implements.
//
// A Server serves any number of resources from one process, one unix socket
// per resource, registers each with the kubelet (directly or through the
// kubelet's plugin watcher), re-registers when the kubelet restarts, streams
// health changes to every ListAndWatch stream and removes its sockets on
// shutdown.
package deviceplugin

import (
	"context"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Device is one device of a resource, as the plugin last saw it.
type Device struct {
	// ID identifies the device within its resource. It must be unique and
	// stable across snapshots.
	ID string
	// Healthy reports whether the device can be allocated.
	Healthy bool
	// NUMANodes lists the NUMA nodes the device is attached to; empty when
	// the host has no NUMA information for it.
	NUMANodes []int64
}

// Plugin is what a device plugin author implements for one resource.
type Plugin interface {
	// Scan discovers the resource's devices and calls notify with a full
	// snapshot of them, first as soon as it knows them and then every time
	// anything changes. The framework computes what changed; calling notify
	// with an unchanged snapshot is cheap. notify never blocks on a slow
	// kubelet stream and may be called from any goroutine.
	//
	// Scan runs until ctx is done. Returning nil earlier means the device
	// set is final; returning an error is logged and Scan is called again
	// after a back-off.
	Scan(ctx context.Context, notify func([]Device)) error

	// Allocate returns what one container needs to use the devices with
	// the given IDs: environment variables, mounts, device nodes, CDI
	// device names and annotations. The framework has already checked
	// that every ID is known and healthy. An error's message reaches the
	// kubelet; an error carrying a gRPC status (status.Error) keeps its
	// code, any other becomes codes.Internal.
	Allocate(ctx context.Context, deviceIDs []string) (*pluginapi.ContainerAllocateResponse, error)
}

// PreferredAllocator is implemented by plugins that choose which devices a
// container should get (GetPreferredAllocation). The kubelet calls it
// before Allocate with the devices still available.
type PreferredAllocator interface {
	PreferredAllocation(ctx context.Context, req PreferredAllocationRequest) ([]string, error)
}

// PreferredAllocationRequest is the kubelet's question for one container:
// choose Size devices from Available, including every ID in MustInclude.
type PreferredAllocationRequest struct {
	// Available are the devices the kubelet may allocate, with their
	// health and NUMA nodes as last reported by Scan. IDs the plugin does
	// not know are passed with Healthy false and no NUMA nodes.
	Available []Device
	// MustInclude are IDs the answer must contain.
	MustInclude []string
	// Size is the number of IDs wanted.
	Size int
}

// PreStarter is implemented by plugins that need a call before each
// container that uses their devices starts (PreStartContainer), for
// example to reset a device.
type PreStarter interface {
	PreStartContainer(ctx context.Context, deviceIDs []string) error
}

// Resource names a Plugin with the extended resource it serves, such as
// "example.com/foo".
type Resource struct {
	Name   string
	Plugin Plugin
}
