package pluginwatcher

import (
	"time"

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
// for DevicePlugin). The watcher drives it through a strict sequence for
// every socket: ValidatePlugin, then RegisterPlugin if validation passed,
// then DeRegisterPlugin once the socket is removed or replaced. Calls for
// one socket never overlap; calls for different sockets may run
// concurrently.
type Handler interface {
	// ValidatePlugin returns an error if the plugin cannot be used, for
	// example because none of its versions is supported. The error text is
	// sent to the plugin in NotifyRegistrationStatus.
	ValidatePlugin(name, endpoint string, versions []string) error
	// RegisterPlugin starts using the plugin. timeout, when not nil, bounds
	// how long the handler may take to reach the plugin; nil means the
	// handler's own default. An error is sent to the plugin and the
	// registration is retried after a back-off.
	RegisterPlugin(name, endpoint string, versions []string, timeout *time.Duration) error
	// DeRegisterPlugin stops using a plugin that was registered with the
	// same name and endpoint.
	DeRegisterPlugin(name, endpoint string)
}
