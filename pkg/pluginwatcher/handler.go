package pluginwatcher

import (
	"context"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Plugin types a Handler can be registered for. They are the values a
// plugin returns in PluginInfo.Type from GetInfo.
const (
	DevicePlugin = registerapi.DevicePlugin
	CSIPlugin    = registerapi.CSIPlugin
	DRAPlugin    = registerapi.DRAPlugin
)

// Handler consumes the plugins of one type (for example the device manager
// for DevicePlugin). It is the kubelet's pluginmanager PluginHandler with a
// context in place of RegisterPlugin's timeout argument.
//
// The watcher drives a handler through a strict sequence for every socket:
// ValidatePlugin, then RegisterPlugin if validation passed, then
// DeRegisterPlugin once the socket is removed or replaced. Calls for one
// socket never overlap; calls for different sockets may run concurrently.
// endpoint is what the plugin reported in GetInfo, or the registration
// socket's path when it reported none.
type Handler interface {
	// ValidatePlugin returns an error if the plugin cannot be used, for
	// example because none of its versions is supported. The error text is
	// sent to the plugin in NotifyRegistrationStatus.
	ValidatePlugin(ctx context.Context, name, endpoint string, versions []string) error
	// RegisterPlugin starts using the plugin. ctx is cancelled when the
	// watcher stops. An error is sent to the plugin and the registration
	// is retried after a back-off.
	RegisterPlugin(ctx context.Context, name, endpoint string, versions []string) error
	// DeRegisterPlugin stops using a plugin that was registered with the
	// same name and endpoint. ctx carries the watcher's values but is
	// never cancelled, so that deregistration completes.
	DeRegisterPlugin(ctx context.Context, name, endpoint string)
}
