package verify

import "strings"

// DocsURL is the page that explains every check, how it is judged and how
// to fix a failure: docs/verify.md of the dpkit repository.
const DocsURL = "https://github.com/dpkit/dpkit/blob/main/docs/verify.md"

// Check IDs.
const (
	CheckServing        = "registration.serving"
	CheckVersion        = "registration.version"
	CheckResourceName   = "registration.resource-name"
	CheckOptions        = "registration.options"
	CheckFirstMessage   = "listandwatch.first-message"
	CheckFullList       = "listandwatch.full-list"
	CheckVanished       = "listandwatch.vanished-devices"
	CheckDeviceIDs      = "listandwatch.device-ids"
	CheckStreams        = "listandwatch.concurrent-streams"
	CheckHealth         = "listandwatch.health-updates"
	CheckMessageSize    = "listandwatch.message-size"
	CheckResponses      = "allocate.responses"
	CheckUnknown        = "allocate.unknown-device"
	CheckUnhealthy      = "allocate.unhealthy-device"
	CheckConcurrent     = "allocate.concurrent"
	CheckEveryDevice    = "allocate.every-device"
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
	// Fix says how to make a plugin that fails the check pass it. It is
	// also the *Fix* of the check's section in docs/verify.md.
	Fix string `json:"fix"`
	// SDKFix, when set, is the fix for a plugin built on dpkit's SDK
	// (pkg/deviceplugin), in the SDK's terms; a report gives it instead of
	// Fix when the plugin answers with the SDK's header
	// (deviceplugin.SDKHeader). It is also the *Fix with the dpkit SDK*
	// of the check's section in docs/verify.md.
	SDKFix string `json:"sdkFix,omitempty"`
}

// DocsURL is the link to the check's section in docs/verify.md. Each
// check has a heading "### `<id>`" there; the fragment is the one GitHub
// makes of it: lower case, without the characters other than letters,
// digits, '-' and '_' (registration.serving: #registrationserving).
func (c CheckInfo) DocsURL() string {
	anchor := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		case r >= 'A' && r <= 'Z':
			return r - 'A' + 'a'
		}
		return -1
	}, c.ID)
	return DocsURL + "#" + anchor
}

// sdkFix returns the fix, in the SDK's terms, of a check that a plugin
// built on dpkit's SDK can fail in a way of its own (CheckInfo.SDKFix);
// "" for the others.
func sdkFix(id string) string {
	switch id {
	case CheckFirstMessage:
		return "call `notify`, the function `Scan` is given, with the full device list as soon as you know the devices, before waiting for changes. The SDK registers with no devices when `Scan` has not called it within `Config.FirstScanWait` (5s), and refuses a list that names a device ID twice (its error log names both entries)."
	case CheckFullList:
		return "keep the full device list and pass all of it, with current health, to `notify` every time: the SDK sends each stream the list `notify` was last given."
	case CheckVanished:
		return "each ListAndWatch response must list every device; with the SDK, pass the whole list to `notify` (the function `Scan` is given), not the changed device."
	case CheckEveryDevice:
		return "make your `Allocate` method work for every device `Scan` reports, alone and together with others; pass a device that cannot be used to `notify` with `Healthy: false`, and the SDK refuses it before your `Allocate` runs."
	}
	return ""
}

// checkText is a check's texts as the lists of checks give them.
type checkText struct{ ID, Description, Basis, Fix string }

// infos turns texts into CheckInfos, with their SDK fixes.
func infos(texts []checkText) []CheckInfo {
	out := make([]CheckInfo, len(texts))
	for i, t := range texts {
		out[i] = CheckInfo{ID: t.ID, Description: t.Description, Basis: t.Basis, Fix: t.Fix, SDKFix: sdkFix(t.ID)}
	}
	return out
}

// Checks returns every check in the order they are reported.
func Checks() []CheckInfo {
	return infos([]checkText{
		{CheckServing, "the plugin's socket answers GetDevicePluginOptions when Register arrives",
			"the kubelet dials the plugin and calls GetDevicePluginOptions inside Register, and refuses the registration if that fails (devicemanager plugin/v1beta1 server.go Register -> connectClient)",
			"listen on the socket and start the gRPC server, then register. Also after a restart: re-create the socket before calling Register again."},
		{CheckVersion, "Register asks for a supported API version (v1beta1)",
			"the kubelet refuses other versions: \"requested API version %q is not supported by kubelet\"",
			"send `pluginapi.Version`."},
		{CheckResourceName, "the resource name is a valid extended resource name",
			"the kubelet refuses names that fail IsExtendedResourceName: \"the ResourceName %q is invalid\"",
			"use a domain you own, e.g. `example.com/gpu`."},
		{CheckOptions, "the options match the RPCs the plugin implements",
			"the kubelet calls GetPreferredAllocation when GetPreferredAllocationAvailable and PreStartContainer when PreStartRequired; Unimplemented fails pod admission or container start",
			"derive the options from what you implement (the dpkit SDK does)."},
		{CheckFirstMessage, "the first ListAndWatch message comes at once and is complete and well-formed",
			"the kubelet takes each message as the full device list (PluginListAndWatchReceiver replaces the set)",
			"send the full list at once when a stream opens, before waiting for changes."},
		{CheckFullList, "every ListAndWatch message lists every device, not only the ones that changed",
			"the kubelet replaces the resource's whole device set with each message (PluginListAndWatchReceiver -> genericDeviceUpdateCallback): a device a message leaves out is removed from the node's capacity",
			"keep the full device list and send all of it, with current health, in every message (the dpkit SDK does: plugins report snapshots)."},
		{CheckVanished, "no device vanishes from one ListAndWatch update to the next while the stream stays open (a warning at most)",
			"the kubelet replaces the resource's device set with each message: a device an update leaves out is removed from the node's capacity, as if unplugged. verify cannot tell a device really removed from one left out by mistake, so it warns",
			"each ListAndWatch response must list every device: send the full list, with current health, in every message, and leave a device out only when it is gone from the node."},
		{CheckDeviceIDs, "device IDs have no control characters (warns on path separators)",
			"the kubelet takes IDs as opaque strings but writes them to its checkpoint, logs and the PodResources API, and plugins and runtimes build device paths and CDI names from them; a control character (often a newline kept from a sysfs read) corrupts every one of those",
			"trim what you read (`strings.TrimSpace`), and replace `/` in IDs you make up."},
		{CheckStreams, "several ListAndWatch streams can be open at once and each gets the devices",
			"the kubelet opens a new stream on every registration while an older connection may still be open",
			"keep per-stream state; broadcast changes to every stream."},
		{CheckHealth, "health changes reach every open ListAndWatch stream",
			"the kubelet only learns of unhealthy devices from ListAndWatch updates",
			"send updates to all streams, not only to the first or the latest."},
		{CheckMessageSize, "every ListAndWatch message is below the kubelet's 4 MiB receive limit",
			"the kubelet's gRPC client keeps the 4 MiB default; a larger message ends the stream (kubernetes#109304)",
			"split the devices over several resources, or shorten IDs and topology."},
		{CheckResponses, "Allocate answers one response per container request",
			"the kubelet fails admission when the number of responses differs from the requests (kubernetes#130172)",
			"append one ContainerAllocateResponse per ContainerRequest."},
		{CheckUnknown, "Allocate refuses a device ID the plugin does not have",
			"the kubelet trusts the plugin's answer; accepting unknown IDs hides accounting bugs",
			"look every requested ID up; return `InvalidArgument`."},
		{CheckUnhealthy, "Allocate refuses an unhealthy device",
			"a device reported Unhealthy must not be handed to a container",
			"check health at Allocate time; return `FailedPrecondition`."},
		{CheckConcurrent, "concurrent Allocate calls all succeed",
			"the kubelet admits pods in parallel with other RPCs on the same connection",
			"no global \"busy\" state; protect shared state with locks instead."},
		{CheckEveryDevice, "Allocate succeeds for every healthy device alone, in pairs and all together",
			"the kubelet may hand any healthy device the plugin lists to a container, alone or with others, and fails the pod when Allocate fails",
			"make Allocate work for every device you list, alone and together with others; a device that cannot be used must be reported Unhealthy in ListAndWatch, not fail Allocate."},
		{CheckPrefSize, "GetPreferredAllocation returns allocationSize IDs",
			"the kubelet uses the answer as the allocation when it has the requested size",
			"start from mustInclude, add from available only, stop at the size (the dpkit SDK repairs answers that break these rules)."},
		{CheckPrefMust, "GetPreferredAllocation includes every mustInclude ID, whatever its position in the available list",
			"the kubelet passes devices it already decided on (reused init-container devices, topology) as mustInclude",
			"start from mustInclude, add from available only, stop at the size (the dpkit SDK repairs answers that break these rules)."},
		{CheckPrefAvailable, "GetPreferredAllocation returns only available IDs, without duplicates",
			"the kubelet may only allocate devices in availableDeviceIDs",
			"start from mustInclude, add from available only, stop at the size (the dpkit SDK repairs answers that break these rules)."},
		{CheckPreStart, "PreStartContainer succeeds for an allocated device",
			"with PreStartRequired the kubelet calls PreStartContainer before every container start and fails the start on error",
			"make PreStartContainer idempotent and quick; return an error only when the device really cannot be used."},
		{CheckKubeletRestart, "the plugin registers again after kubelet.sock is re-created, within the threshold, several times (warns above --reregister-warn)",
			"a restarting kubelet removes every socket in its directory and forgets every plugin; only a new Register brings the resource back, and the node lacks it until then",
			"watch the directory (fsnotify) for kubelet.sock being created; then re-create your socket and register at once. Polling every 10s, as the upstream sample plugin does, leaves the node without the resource for that long after every kubelet restart."},
		{CheckSocketDeleted, "the plugin serves and registers again after its socket is deleted (a warning at most)",
			"the kubelet removes plugin sockets only when it starts, together with re-creating kubelet.sock (restart.kubelet); recovering from a deletion by something else is robustness, not something the kubelet needs",
			"watch your socket's removal; listen again (on a new socket path, or after closing the old server) and register."},
		{CheckOldEndpoint, "re-registering on the same socket path, the plugin has closed the kubelet's connection to the old socket",
			"the kubelet keeps one endpoint per resource and socket path and refuses a registration for a path it is still connected to (\"device plugin already connected: <socket>\"); the resource then stays on the old connection, whose devices stay advertised after the plugin dies",
			"listen on a new socket path each time (e.g. a per-instance suffix and a counter), or stop the old gRPC server (which closes its connections) before registering again."},
		{CheckSingleReg, "one registration per start or restart: no registration storm",
			"every Register makes the kubelet drop and re-create the plugin's endpoint and stream",
			"serialise registrations; before registering again, check whether the current kubelet.sock (same inode and modification time) already has you."},
		{CheckPluginWatcher, "the plugin watcher (plugins_registry) path works when the plugin offers it",
			"the kubelet's plugin watcher calls GetInfo and ValidatePlugin: type DevicePlugin, a supported version, a valid name",
			"answer GetInfo with type `DevicePlugin`, your resource name and `v1beta1`."},
		{CheckExit, "the plugin exits soon after SIGTERM",
			"a DaemonSet pod is stopped with SIGTERM and killed after its grace period",
			"handle SIGTERM (`signal.NotifyContext`), stop serving and remove your socket; never exit on a recoverable error."},
		{CheckSocketRemoved, "the plugin removes its socket when it exits",
			"a stale socket makes the kubelet or the next plugin instance dial a dead endpoint (kubernetes#121994: one socket per instance)",
			"remove your socket on SIGTERM; leave sockets that are not yours (the path may already belong to the next instance)."},
	})
}
