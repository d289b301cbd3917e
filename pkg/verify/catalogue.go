package verify

// Check IDs.
const (
	CheckServing        = "registration.serving"
	CheckVersion        = "registration.version"
	CheckResourceName   = "registration.resource-name"
	CheckOptions        = "registration.options"
	CheckFirstMessage   = "listandwatch.first-message"
	CheckFullList       = "listandwatch.full-list"
	CheckDeviceIDs      = "listandwatch.device-ids"
	CheckStreams        = "listandwatch.concurrent-streams"
	CheckHealth         = "listandwatch.health-updates"
	CheckMessageSize    = "listandwatch.message-size"
	CheckResponses      = "allocate.responses"
	CheckUnknown        = "allocate.unknown-device"
	CheckUnhealthy      = "allocate.unhealthy-device"
	CheckConcurrent     = "allocate.concurrent"
	CheckPrefSize       = "preferred.size"
	CheckPrefMust       = "preferred.must-include"
	CheckPrefAvailable  = "preferred.available-only"
	CheckPreStart       = "prestart"
	CheckKubeletRestart = "restart.kubelet"
	CheckSocketDeleted  = "restart.socket-deleted"
	CheckOldEndpoint    = "restart.old-endpoint"
	CheckSingleReg      = "restart.single-registration"
	CheckPluginWatcher  = "plugin-watcher"
	CheckExit           = "shutdown.exit"
	CheckSocketRemoved  = "shutdown.socket-removed"
)

// CheckInfo describes a check.
type CheckInfo struct {
	ID          string `json:"id"`
	Description string `json:"description"`
	// Basis is the kubelet behaviour the check is based on.
	Basis string `json:"basis"`
}

// Checks returns every check in the order they are reported.
func Checks() []CheckInfo {
	return []CheckInfo{
		{CheckServing, "the plugin's socket answers GetDevicePluginOptions when Register arrives",
			"the kubelet dials the plugin and calls GetDevicePluginOptions inside Register, and refuses the registration if that fails (devicemanager plugin/v1beta1 server.go Register -> connectClient)"},
		{CheckVersion, "Register asks for a supported API version (v1beta1)",
			"the kubelet refuses other versions: \"requested API version %q is not supported by kubelet\""},
		{CheckResourceName, "the resource name is a valid extended resource name",
			"the kubelet refuses names that fail IsExtendedResourceName: \"the ResourceName %q is invalid\""},
		{CheckOptions, "the options match the RPCs the plugin implements",
			"the kubelet calls GetPreferredAllocation when GetPreferredAllocationAvailable and PreStartContainer when PreStartRequired; Unimplemented fails pod admission or container start"},
		{CheckFirstMessage, "the first ListAndWatch message comes at once and is complete and well-formed",
			"the kubelet takes each message as the full device list (PluginListAndWatchReceiver replaces the set)"},
		{CheckFullList, "every ListAndWatch message lists every device, not only the ones that changed",
			"the kubelet replaces the resource's whole device set with each message (PluginListAndWatchReceiver -> genericDeviceUpdateCallback): a device a message leaves out is removed from the node's capacity"},
		{CheckDeviceIDs, "device IDs have no control characters (warns on path separators)",
			"the kubelet takes IDs as opaque strings but writes them to its checkpoint, logs and the PodResources API, and plugins and runtimes build device paths and CDI names from them; a control character (often a newline kept from a sysfs read) corrupts every one of those"},
		{CheckStreams, "several ListAndWatch streams can be open at once and each gets the devices",
			"the kubelet opens a new stream on every registration while an older connection may still be open"},
		{CheckHealth, "health changes reach every open ListAndWatch stream",
			"the kubelet only learns of unhealthy devices from ListAndWatch updates"},
		{CheckMessageSize, "every ListAndWatch message is below the kubelet's 4 MiB receive limit",
			"the kubelet's gRPC client keeps the 4 MiB default; a larger message ends the stream (kubernetes#109304)"},
		{CheckResponses, "Allocate answers one response per container request",
			"the kubelet fails admission when the number of responses differs from the requests (kubernetes#130172)"},
		{CheckUnknown, "Allocate refuses a device ID the plugin does not have",
			"the kubelet trusts the plugin's answer; accepting unknown IDs hides accounting bugs"},
		{CheckUnhealthy, "Allocate refuses an unhealthy device",
			"a device reported Unhealthy must not be handed to a container"},
		{CheckConcurrent, "concurrent Allocate calls all succeed",
			"the kubelet admits pods in parallel with other RPCs on the same connection"},
		{CheckPrefSize, "GetPreferredAllocation returns allocationSize IDs",
			"the kubelet uses the answer as the allocation when it has the requested size"},
		{CheckPrefMust, "GetPreferredAllocation includes every mustInclude ID, whatever its position in the available list",
			"the kubelet passes devices it already decided on (reused init-container devices, topology) as mustInclude"},
		{CheckPrefAvailable, "GetPreferredAllocation returns only available IDs, without duplicates",
			"the kubelet may only allocate devices in availableDeviceIDs"},
		{CheckPreStart, "PreStartContainer succeeds for an allocated device",
			"with PreStartRequired the kubelet calls PreStartContainer before every container start and fails the start on error"},
		{CheckKubeletRestart, "the plugin registers again after kubelet.sock is re-created, within the threshold, several times (warns above --reregister-warn)",
			"a restarting kubelet removes every socket in its directory and forgets every plugin; only a new Register brings the resource back, and the node lacks it until then"},
		{CheckSocketDeleted, "the plugin serves and registers again after its socket is deleted (a warning at most)",
			"the kubelet removes plugin sockets only when it starts, together with re-creating kubelet.sock (restart.kubelet); recovering from a deletion by something else is robustness, not something the kubelet needs"},
		{CheckOldEndpoint, "re-registering on the same socket path, the plugin has closed the kubelet's connection to the old socket",
			"the kubelet keeps one endpoint per resource and socket path and refuses a registration for a path it is still connected to (\"device plugin already connected: <socket>\"); the resource then stays on the old connection, whose devices stay advertised after the plugin dies"},
		{CheckSingleReg, "one registration per start or restart: no registration storm",
			"every Register makes the kubelet drop and re-create the plugin's endpoint and stream"},
		{CheckPluginWatcher, "the plugin watcher (plugins_registry) path works when the plugin offers it",
			"the kubelet's plugin watcher calls GetInfo and ValidatePlugin: type DevicePlugin, a supported version, a valid name"},
		{CheckExit, "the plugin exits soon after SIGTERM",
			"a DaemonSet pod is stopped with SIGTERM and killed after its grace period"},
		{CheckSocketRemoved, "the plugin removes its socket when it exits",
			"a stale socket makes the kubelet or the next plugin instance dial a dead endpoint (kubernetes#121994: one socket per instance)"},
	}
}
