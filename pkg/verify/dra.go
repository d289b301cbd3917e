package verify

import (
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// DRA check IDs (dpkit verify --dra).
const (
	CheckDRARegistration   = "dra.registration"
	CheckDRAKubeletRestart = "dra.registration.kubelet-restart"
	CheckDRADriverRestart  = "dra.registration.driver-restart"
	CheckDRASlices         = "dra.slices.valid"
	CheckDRASlicesRestart  = "dra.slices.republished"
	CheckDRASlicesRemoved  = "dra.slices.removed"
	CheckDRAGeneration     = "dra.slices.generation"
	CheckDRAPrepare        = "dra.prepare.results"
	CheckDRAIdempotent     = "dra.prepare.idempotent"
	CheckDRAPerClaimError  = "dra.prepare.per-claim-error"
	CheckDRAUnknownClaim   = "dra.unprepare.unknown-claim"
	CheckDRACDI            = "dra.prepare.cdi"
	CheckDRAReboot         = "dra.prepare.after-reboot"
	CheckDRASharedDevice   = "dra.prepare.shared-device"
	CheckDRATimeout        = "dra.prepare.timeout"
	CheckDRAHealth         = "dra.health"
	CheckDRAExit           = "dra.shutdown.exit"
	CheckDRARBAC           = "dra.rbac"
	// What drivers publish and prepare (issue 35, item 4, part B).
	CheckDRACDIValid           = "dra.prepare.cdi-valid"
	CheckDRACDIUnique          = "dra.prepare.cdi-unique"
	CheckDRAPrioritizedList    = "dra.prepare.prioritized-list"
	CheckDRAClaimStatus        = "dra.claim.status-devices"
	CheckDRAPartitionable      = "dra.slices.partitionable"
	CheckDRAConsumableCapacity = "dra.slices.consumable-capacity"
	CheckDRAHealthDevices      = "dra.health.published-devices"
)

// DRA check IDs of the driver's life: a rolling update, an older kubelet,
// claims unprepared after a restart or a deletion, batched, concurrent and
// misplaced calls.
const (
	CheckDRARollingUpdate    = "dra.registration.rolling-update"
	CheckDRAVersionSkew      = "dra.registration.version-skew"
	CheckDRAUnprepareRestart = "dra.unprepare.after-restart"
	CheckDRADeletedClaim     = "dra.unprepare.deleted-claim"
	CheckDRABatch            = "dra.prepare.batch"
	CheckDRAConcurrent       = "dra.prepare.concurrent"
	CheckDRAOtherNode        = "dra.prepare.other-node"
)

// DRAChecks returns every check of dpkit verify --dra in the order they
// are reported. Each check's Basis ends with what it rests on ("Rests
// on: "): the kubelet's code path (Kubernetes v1.37, paths in
// k8s.io/kubernetes unless a module is named) or the API field it reads.
func DRAChecks() []CheckInfo {
	return infos([]checkText{
		{CheckDRARegistration, "the driver registers through plugins_registry: GetInfo type DRAPlugin, a valid name, service names as versions, an endpoint under the plugins directory",
			"the kubelet's plugin watcher calls GetInfo on every socket in plugins_registry and hands type DRAPlugin to the DRA manager, which calls the first DRAPlugin service of the versions that it speaks (v1.DRAPlugin, else v1beta1.DRAPlugin; verify calls the driver in the same one) and reports the outcome with NotifyRegistrationStatus. " +
				"Rests on: pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go GenerateRegisterPluginFunc; pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go validateSupportedServices, RegisterPlugin.",
			"serve the registration socket in $DPKIT_REGISTRY_DIR (<driver>-reg.sock) and answer GetInfo with type `DRAPlugin`, your driver name, the endpoint <plugins dir>/<driver>/dra.sock and the versions `v1.DRAPlugin` (and `v1.DRAResourceHealth` if you serve health)."},
		{CheckDRAKubeletRestart, "after a kubelet restart the driver is registered again within the threshold (warns above --reregister-warn)",
			"a restarting kubelet's plugin watcher finds the registration socket again and calls GetInfo and NotifyRegistrationStatus; a driver that answers only once stays unregistered and its claims cannot be prepared. " +
				"Rests on: pkg/kubelet/pluginmanager/reconciler/reconciler.go reconcile (every socket of plugins_registry is registered again by a started kubelet).",
			"keep the registration server running for the life of the driver and answer GetInfo every time it is asked."},
		{CheckDRADriverRestart, "a driver killed without cleaning up (stale sockets left) starts again and registers within the threshold (warns above --reregister-warn)",
			"a DaemonSet pod is restarted after a crash or an update; the sockets of the old instance stay behind, and only a new registration brings the driver back to the kubelet. " +
				"Rests on: pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go RegisterPlugin, DeRegisterPlugin.",
			"remove a stale socket file before listening on its path (the kubeletplugin helper does, and so pkg/draplugin), and register as soon as the gRPC servers run."},
		{CheckDRASlices, "the ResourceSlices for the node are valid: selected by spec.nodeName (and owned by the Node), spec.nodeSelector, spec.allNodes or spec.perDeviceNodeSelection; at most 128 devices per slice; per pool one generation, resourceSliceCount slices and no device twice",
			"the scheduler allocates from the slices that select the node, only from complete pools of their newest generation whose device names are unique; the kubelet removes a driver's slices by spec.nodeName, and the Node's deletion removes the slices it owns. " +
				"Rests on: k8s.io/dynamic-resource-allocation/structured GatherPools and NodeMatches (spec.nodeName, spec.nodeSelector, spec.allNodes, spec.perDeviceNodeSelection, spec.pool); pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go wipeResourceSlices; metadata.ownerReferences.",
			"publish for $NODE_NAME: spec.nodeName with an owner reference to the Node (as the kubeletplugin helper does), or a node selector that matches the Node; split the devices into slices of at most 128, and give every slice of the pool the same generation and resourceSliceCount."},
		{CheckDRASlicesRestart, "after the driver's restart, once it is done publishing, its ResourceSlices for the node list the same devices",
			"the scheduler allocates only the devices that the slices list; a restarted driver that publishes fewer, or none, takes its devices from the node until it does. " +
				"Rests on: k8s.io/dynamic-resource-allocation/structured GatherPools (spec.devices of complete pools).",
			"on start, publish the same devices again; the kubeletplugin helper's ResourceSlice controller finds the existing slices and keeps them."},
		{CheckDRAGeneration, "every write of the driver's slices is one the upstream ResourceSlice controller makes: the pool generation never goes backwards, and a change that adds a slice to a complete generation or alters more than one of its slices comes with a new generation (one slice updated in place is fine)",
			"the scheduler uses only the newest generation of a pool, and only when it is complete; a generation that goes backwards hides the pool's newer slices, and slices of one complete generation changed one after the other mix old and new (a device in two slices, counts that disagree). The upstream controller keeps the generation only for one update of one existing slice. " +
				"Rests on: spec.pool.generation and spec.pool.resourceSliceCount; k8s.io/dynamic-resource-allocation/resourceslice Controller.syncPool; k8s.io/dynamic-resource-allocation/structured GatherPools.",
			"publish through the kubeletplugin helper's ResourceSlice controller, or do what it does: keep the generation only when the change is one update of one existing slice, otherwise write every slice of the pool with a higher generation; never lower it."},
		{CheckDRASlicesRemoved, "after the driver exits its ResourceSlices are removed, by the driver or (reported) left to the kubelet or to the driver's next start",
			"the kubelet deletes a driver's spec.nodeName ResourceSlices on its node when the driver stays unregistered; slices that select the node otherwise stay until the driver, or the Node's deletion when it owns them, removes them. " +
				"Rests on: pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go wipeResourceSlices (field selector spec.nodeName).",
			"nothing to do: the kubelet removes the spec.nodeName slices of an unregistered driver; a driver that is uninstalled may delete its slices itself."},
		{CheckDRAPrepare, "NodePrepareResources answers one result per claim, with the allocated devices",
			"the kubelet looks each claim's result up by UID, and fails the pod on a result for a claim it did not send, on a per-claim error and when a result is missing (\"NodePrepareResources skipped %d ResourceClaims\"). " +
				"Rests on: pkg/kubelet/cm/dra/manager.go prepareResources.",
			"return a NodePrepareResourceResponse for every claim of the request, keyed by its UID."},
		{CheckDRAIdempotent, "preparing a prepared claim again succeeds with the same devices",
			"the kubelet sends a claim again whenever its checkpoint does not mark it prepared: after another claim or driver of the pod failed, or when the kubelet stopped between the call and its checkpoint; it replaces the claim's devices with the last answer. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go prepareResources (claimInfo.isPrepared, resetDevices).",
			"keep what you prepared (a checkpoint) and answer a repeated Prepare from it."},
		{CheckDRAPerClaimError, "a claim that cannot be prepared gets a per-claim error and the others of the request still succeed",
			"the kubelet batches the claims it prepares with a driver into one call and fails all of them on an error for the whole call. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go prepareResources (\"NodePrepareResources: %w\"); NodePrepareResourceResponse.error (pkg/apis/dra/v1/api.proto).",
			"return a per-claim `error` in its result, never a gRPC error, for a problem with one claim."},
		{CheckDRAUnknownClaim, "NodeUnprepareResources of a claim the driver never prepared succeeds",
			"the kubelet unprepares the claims of its checkpoint that no pod uses, also after its restart and after a failed Prepare, and retries while a result has an error, which keeps the pod from being removed. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go unprepareResources (\"NodeUnprepareResources failed for ResourceClaim\").",
			"treat unpreparing an unknown claim as done."},
		{CheckDRACDI, "every CDI device ID a Prepare returns is defined in a CDI spec file in $DPKIT_CDI_DIR that parses",
			"the kubelet passes the CDI IDs of each result to the container runtime, which fails the container when a device is not in its CDI specs. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go GetResources (ContainerInfo.CDIDevices); Device.cdi_device_ids (pkg/apis/dra/v1/api.proto).",
			"write the spec (tags.cncf.io/container-device-interface) to the CDI directory before answering Prepare, and return IDs of the form vendor/class=device naming its devices."},
		{CheckDRAReboot, "after a reboot (CDI directory wiped, driver restarted) Prepare of a checkpointed claim writes its CDI spec again",
			"/var/run/cdi is a tmpfs emptied by a reboot while the kubelet's and the driver's checkpoints survive; the kubelet prepares the claim again and the runtime needs the spec (kubernetes#141433). " +
				"Rests on: pkg/kubelet/cm/dra/manager.go prepareResources and GetResources; Device.cdi_device_ids (pkg/apis/dra/v1/api.proto).",
			"when answering Prepare from your checkpoint, check that the CDI spec file exists and write it again if not."},
		{CheckDRASharedDevice, "a device prepared for one claim is prepared for a second claim whose allocation has adminAccess; one without admin access is reported (refused, or allowed by allowMultipleAllocations: pass; prepared otherwise: a warning)",
			"the scheduler gives a device held by a claim to another only when the result has admin access (it leaves such results out of the devices in use) or the device allows multiple allocations; the kubelet prepares every allocated claim and does not compare devices, so a driver that refuses an admin-access claim fails its pod, and one that prepares any second claim has no last line of defense against a broken allocation. " +
				"Rests on: status.allocation.devices.results[].adminAccess, spec.devices[].allowMultipleAllocations; pkg/scheduler/framework/plugins/dynamicresources/allocateddevices.go; pkg/kubelet/cm/dra/manager.go prepareResources; k8s.io/dynamic-resource-allocation/kubeletplugin DRAPlugin.PrepareResourceClaims (a driver should refuse devices in use).",
			"prepare a claim whose allocation result has `adminAccess: true` whatever other claim holds the device, without taking the device from it; refuse, with a per-claim error, a second claim without admin access on a device that does not allow multiple allocations."},
		{CheckDRATimeout, "every NodePrepareResources and NodeUnprepareResources call is answered within --prepare-timeout (45s)",
			"the kubelet gives each call to a driver 45s and fails the pod's start when it runs out. " +
				"Rests on: pkg/kubelet/cm/dra/plugin/dra_plugin.go defaultClientCallTimeout.",
			"do slow device set-up in the background or in advance; answer Prepare from what is ready."},
		{CheckDRAHealth, "when the driver reports health, the stream reports every published device and again within its health timeout (the driver's health_check_timeout_seconds, else --health-timeout; warns when later, fails when not within twice that); a driver that declines (Unimplemented) is skipped",
			"the kubelet watches the negotiated DRAResourceHealth service (v1, else v1alpha1), holds each report for the device's health_check_timeout_seconds (30s when not above 0) and shows the device Unknown after that in pods' status; it stops watching a driver whose stream answers Unimplemented. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go buildDeviceHealth, HandleWatchResourcesStream; pkg/kubelet/cm/dra/healthinfo.go getHealthInfo; pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go add (codes.Unimplemented).",
			"send the health of every published device when a stream opens and again within each device's health timeout (every half of it leaves room), or answer the stream with Unimplemented (the kubeletplugin helper's ErrHealthNotSupported) when you report no health."},
		{CheckDRAExit, "once the driver is done starting, it exits within --term-timeout after SIGTERM (warns up to twice that) and removes its sockets",
			"a DaemonSet pod is stopped with SIGTERM and killed after its grace period; a registration socket left behind keeps the driver registered, and the kubelet dials its endpoint until it is replaced. " +
				"Rests on: the pod's spec.terminationGracePeriodSeconds; pkg/kubelet/pluginmanager/reconciler/reconciler.go reconcile (a plugin is unregistered when its socket is gone).",
			"handle SIGTERM (`signal.NotifyContext`), stop the gRPC servers and remove your sockets."},
		{CheckDRARBAC, "the driver needs no more of the API server than its RBAC (--rbac, default dpkit's deploy/components/dra/rbac.yaml): none of its requests is forbidden",
			"in a cluster the driver runs as a ServiceAccount bound to the RBAC its manifests ship; a request outside it is forbidden there, so the driver fails only once it is installed. " +
				"Rests on: plugin/pkg/auth/authorizer/rbac/rbac.go Authorize, which checks every request against the rules[].apiGroups, rules[].resources and rules[].verbs of the ClusterRoles and Roles bound to the ServiceAccount.",
			"grant what the detail names (the verb, the resource and its API group) in the RBAC you ship with the driver and give that file to verify with --rbac, or do without the request."},
		{CheckDRACDIValid, "every CDI spec file the driver wrote for its claims is valid as the CDI library of the container runtimes reads it: a known cdiVersion no lower than the fields it uses need, a valid kind, device names and container edits",
			"containerd and CRI-O resolve the CDI device IDs the kubelet hands them through the CDI library's cache, which reads each spec file with ReadSpec and leaves out a file that does not validate, every device in it, so that a container naming one of them fails to start (\"unresolvable CDI devices\"); a spec declaring a cdiVersion lower than a field it uses needs (annotations 0.6.0, additionalGids and intelRdt 0.7.0, netDevices 1.1.0) is such a file. " +
				"Rests on: tags.cncf.io/container-device-interface pkg/cdi/spec.go ReadSpec, Spec.validate (specs-go/version.go ValidateVersion) and pkg/cdi/cache.go InjectDevices; pkg/kubelet/cm/dra/manager.go GetResources.",
			"write the spec with the CDI library (or set cdiVersion to specs-go MinimumRequiredVersion of the spec you write), and read your specs back with cdi.ReadSpec in your tests."},
		{CheckDRACDIUnique, "no CDI device is defined by two spec files while the claims using them are prepared (claim-a, claim-b and claim-admin, which shares claim-a's device), and a claim's CDI IDs still resolve once another claim on its device is unprepared",
			"the CDI library of the container runtimes drops a fully qualified device that two spec files of one directory define (\"conflicting device\"), so that the container of neither claim gets it; a driver that names CDI devices after the device instead of the claim collides as soon as two claims share a device (admin access, multiple allocations), and one whose Unprepare removes a spec file that another claim uses takes the device from that claim's containers. " +
				"Rests on: tags.cncf.io/container-device-interface pkg/cdi/cache.go refresh (resolveConflict) and InjectDevices; pkg/kubelet/cm/dra/manager.go GetResources.",
			"name a claim's CDI devices after the claim (its UID, as pkg/draplugin does) and write one spec file per claim, which only that claim's Unprepare removes."},
		{CheckDRAPrioritizedList, "a claim whose request chose a subrequest of firstAvailable (the allocation result names request req/small) is prepared, its devices answered under the request name req (or under none)",
			"a container names a request of a claim by its main name, a DNS label; the kubelet hands it the CDI devices of each answered device whose request_names is empty or holds exactly that name, and strips no subrequest itself, so that a device answered under req/small reaches no container (the kubeletplugin helper strips the subrequest for its drivers). " +
				"Rests on: pkg/kubelet/cm/dra/claiminfo.go cdiDevicesAsList; status.allocation.devices.results[].request; Device.request_names (pkg/apis/dra/v1/api.proto).",
			"answer each device with the request of its allocation result cut at the first '/' (req/small is request req), or with no request names, and look the request up in the claim's spec by that main name."},
		{CheckDRAClaimStatus, "where the driver writes status.devices of the claims it prepares, each entry names one of this driver's devices of the claim's allocation and the API server accepts every write (data a JSON object, networkData IPs in CIDR form, conditions valid); a driver that writes none is skipped",
			"status.devices is where a driver tells users and controllers what it set up for a claim (KEP-4817: conditions, data, networkData), each entry owned by its driver; the API server refuses an entry for a device the claim was not allocated, invalid data or networkData, and, with DRAResourceClaimGranularStatusAuthorization, a writer without arbitrary-node:update or associated-node:update on resourceclaims/driver of the driver's name, and a refused write leaves the claim without the driver's status. " +
				"Rests on: status.devices; pkg/apis/resource/validation/validation.go validateDeviceStatus; pkg/registry/resource/utils.go AuthorizedForDeviceStatus.",
			"write entries only for your own results of the claim's allocation (driver, pool, device, shareID), data as a JSON object and IPs as CIDRs; grant your ServiceAccount update on resourceclaims/status and arbitrary-node:update on resourceclaims/driver with your driver's name as resourceNames, and log or retry a write that fails."},
		{CheckDRAPartitionable, "where a pool uses sharedCounters and consumesCounters, every counter set and counter a device consumes is defined in the newest generation of its pool, no counter set twice, and no device consumes more of a counter than its set holds; a driver without counters is skipped",
			"the API server validates each slice alone (counter sets in slices of their own, at most 8 per slice, at most 64 devices in a slice whose devices consume counters); the scheduler gathers the counter sets of every slice of a pool and marks the whole pool invalid, none of its devices allocated, when a device consumes a set or a counter the pool does not define or a set is defined twice, and never allocates a device that consumes more than its set holds. " +
				"Rests on: spec.sharedCounters, spec.devices[].consumesCounters; k8s.io/dynamic-resource-allocation/structured/internal/incubating/pools_incubating.go buildPool (getAndValidateCounterSets, validateDeviceCounterConsumption) and allocator_incubating.go checkAvailableCounters.",
			"publish each counter set once per pool, in a slice of its own written in the same generation as the devices that consume it (the kubeletplugin helper's resourceslice.Slice with SharedCounters), consume only sets and counters defined there, and no more of a counter than its value."},
		{CheckDRAConsumableCapacity, "where a device allows multiple allocations, each capacity's requestPolicy default lies within the capacity (what the API server leaves unchecked), and two claims given shares of it (each result with its own shareID and consumedCapacity) are both prepared, each answer naming its share, their CDI devices apart; a driver without such a device is skipped",
			"the scheduler gives a device with allowMultipleAllocations to many claims, each result with a new shareID and the capacity it consumes (the amount requested, else the policy's default, else all of it), and aborts an allocation that would consume a negative amount; the kubelet prepares each claim and keeps the share_id the driver answers in its checkpoint and PodResources. The API server checks a policy's validValues and validRange but not a default given alone, nor a default above the capacity when validRange has no max. " +
				"Rests on: spec.devices[].allowMultipleAllocations, spec.devices[].capacity; status.allocation.devices.results[].shareID and consumedCapacity; pkg/apis/resource/validation/validation.go validateRequestPolicy; k8s.io/dynamic-resource-allocation/structured/internal/incubating/consumable_capacity.go CmpRequestOverCapacity; pkg/kubelet/cm/dra/manager.go prepareResources (Device.share_id).",
			"keep every requestPolicy default within 0 and the capacity's value; prepare each share of a device that allows multiple allocations as a claim of its own, answer Device.share_id with the result's shareID, and give each share CDI devices of its own (named after the claim)."},
		{CheckDRAHealthDevices, "every device the health stream reports is one the driver publishes for the node: its pool and name are in the driver's ResourceSlices",
			"the kubelet maps a health report to pods by the pool and device names of the devices their claims were prepared with, which the scheduler took from the slices; a report under another pool or name (a device ID, another pool name in the health code) matches no claim and is dropped without a word, so that no pod ever shows that device's health. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go HandleWatchResourcesStream (podsByDevice); DeviceIdentifier pool_name and device_name (pkg/apis/dra-health/v1/api.proto).",
			"report health under the pool and device names your ResourceSlices publish (the kubeletplugin helper's DeviceHealth PoolName and DeviceName), and only for devices you publish for the node."},
		{CheckDRABatch, "one NodePrepareResources call with several claims prepares each (one result per UID, with its device), and one NodeUnprepareResources call with them unprepares each (no error, their CDI specs removed)",
			"the kubelet prepares all the claims of a pod that one driver serves in one call, and unprepares them in one call; it fails the pod when a claim's result is missing or has an error, and retries an Unprepare until every result is clean. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go prepareResources and unprepareResources (one batch per driver; \"NodePrepareResources skipped %d ResourceClaims\", \"NodeUnprepareResources skipped %d ResourceClaims\").",
			"loop over every claim of the request, prepare or unprepare each on its own, and return a result for each, keyed by its UID."},
		{CheckDRAConcurrent, "NodePrepareResources and NodeUnprepareResources calls for different claims, made at once, all succeed with the right devices",
			"the kubelet's pod workers run in parallel and each prepares and unprepares its own pod's claims, without a lock across pods held around the call, so a driver gets calls for different pods at once; an error such as \"busy\" fails that pod's start until its next sync. " +
				"Rests on: pkg/kubelet/pod_workers.go (a goroutine per pod); pkg/kubelet/cm/dra/manager.go prepareResources, unprepareResources (the claim cache lock is released before the call).",
			"serialize the calls inside the driver (a mutex, or a file lock across instances: the kubeletplugin helper serializes by default) instead of refusing the ones that overlap, or prepare different claims concurrently."},
		{CheckDRAOtherNode, "a claim whose allocation names a pool the driver does not publish for the node (another node's) is refused with a per-claim error, not prepared",
			"the kubelet prepares what a claim reserved for its pod says was allocated, without comparing the pool with the node's ResourceSlices; a claim allocated on another node (a broken scheduler or controller, a claim written by hand) would give a container a device of the same name on this node, or none. " +
				"Rests on: status.allocation.devices.results[].pool; pkg/kubelet/cm/dra/manager.go prepareResources (IsReservedForPod, no pool check).",
			"prepare only devices of the pools you publish for this node, by pool and device name, and answer any other with a per-claim error."},
		{CheckDRADeletedClaim, "NodeUnprepareResources of a prepared claim whose ResourceClaim is gone from the API server succeeds and removes its CDI spec",
			"the kubelet unprepares from its own checkpoint and sends only the claim's namespace, name and UID; by then the ResourceClaim is often deleted (a pod's generated claim goes with the pod), and an Unprepare that reads it fails every retry, which keeps the pod from being removed. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go unprepareResources (the drapb.Claim built from claimInfo); NodeUnprepareResourcesRequest.claims (pkg/apis/dra/v1/api.proto).",
			"unprepare from what you recorded at Prepare (your checkpoint), by the claim's UID; never read the ResourceClaim in Unprepare."},
		{CheckDRAUnprepareRestart, "NodeUnprepareResources of a claim prepared before the driver was killed and started again succeeds and removes its CDI spec; unpreparing it a second time succeeds",
			"the kubelet unprepares a claim once its last pod is gone, whenever that is, often after the driver restarted (a crash, an update), from its checkpoint, which outlives the driver; it sends the claim again when it restarted before recording the outcome. A driver that keeps what it prepared in memory only leaves the claim's CDI spec and devices behind. " +
				"Rests on: pkg/kubelet/cm/dra/manager.go unprepareResources; pkg/kubelet/cm/dra/state/checkpoint.go.",
			"keep what you prepared in a checkpoint on disk and undo a claim from it in Unprepare, whether this process prepared it or an earlier one; treat a claim already undone as done."},
		{CheckDRARollingUpdate, "a second instance of the driver, started with another $POD_UID while the first serves, registers; both answer Prepare during the overlap, and once the first has stopped the second is still registered and answers for the claim the first prepared (skipped, with the reason, for a driver that does not run two instances)",
			"a DaemonSet updated with maxSurge starts the new pod beside the old one; the kubelet keeps one plugin per endpoint of a driver, refuses a second registration of an endpoint, calls the newest connected plugin and unregisters a plugin whose registration socket is removed or replaced, so the new instance needs sockets of its own, both instances must answer for the same claims, and the old one's exit must leave the new one's sockets in place. " +
				"Rests on: pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go add (\"endpoint %s already registered\"), get, remove; pkg/kubelet/pluginmanager/reconciler/reconciler.go reconcile; k8s.io/dynamic-resource-allocation/kubeletplugin RollingUpdate, RollingUpdateRegistrarSocketFile.",
			"take the pod's UID from $POD_UID (the downward API's metadata.uid) and put it in the names of both sockets, as the kubeletplugin helper's `RollingUpdate(uid)` does; keep what is prepared where both instances read it (a checkpoint, with Prepare and Unprepare serialized through a file lock, as the helper does); remove only your own sockets on exit. A driver that cannot must be deployed with maxSurge 0."},
		{CheckDRAVersionSkew, "registered by a kubelet v1.34–v1.36 (DRAPlugin v1 or v1beta1, health only in v1alpha1), the driver is prepared in the service that kubelet picks and, if it reports health to a v1.37 kubelet, reports it in v1alpha1 too",
			"a v1.37 control plane serves kubelets down to v1.34. Those before v1.37 pick v1.DRAPlugin or v1beta1.DRAPlugin from the driver's list as v1.37 does, but watch health only in v1alpha1.DRAResourceHealth, whatever the driver lists (v1.36 by default, v1.34 and v1.35 with ResourceHealthStatus on); a driver that serves health only in v1 reports none to them, and their pods show its devices' health Unknown. " +
				"Rests on: pkg/kubelet/cm/dra/plugin/dra_plugin.go servicesSupportedByKubelet and NodeWatchResources (v1.34.4 to v1.36.3: drahealthv1alpha1 only); pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go add and pickHealthService (v1.37); pkg/kubelet/cm/dra/healthinfo.go getHealthInfo (Unknown without a report).",
			"serve DRAResourceHealth in v1 and v1alpha1 and list both in GetInfo, as the kubeletplugin helper does by default (k8s.io/kubelet's drahealthv1.V1ServerWrapper serves a v1 server as v1alpha1)."},
	})
}

// Defaults of DRAConfig.
const (
	DefaultDRARegisterTimeout     = 20 * time.Second
	DefaultDRAReregisterWarn      = time.Second
	DefaultDRAReregisterThreshold = 10 * time.Second
	DefaultPrepareTimeout         = 45 * time.Second
	DefaultDRAHealthTimeout       = 30 * time.Second
)

// DRAConfig configures a run of dpkit verify --dra.
type DRAConfig struct {
	// Command is the driver command and its arguments; the placeholders
	// {registry-dir}, {plugins-dir}, {cdi-dir}, {node-name},
	// {kubeconfig} and {pod-uid} are replaced. Required.
	Command []string
	// RBAC is a file of ClusterRole and Role objects: what the driver is
	// granted (Roles in the run's namespace). Empty: the ClusterRole
	// dpkit-dra of dpkit's deploy/components/dra/rbac.yaml.
	RBAC string
	// Env is the driver's base environment. Default os.Environ().
	Env []string
	// RegisterTimeout bounds the wait for the first registration.
	RegisterTimeout time.Duration
	// ReregisterWarn and ReregisterThreshold: registering again after a
	// kubelet or driver restart slower than these warns or fails.
	ReregisterWarn      time.Duration
	ReregisterThreshold time.Duration
	// PrepareTimeout is the longest a Prepare or Unprepare call may take
	// (the kubelet's 45s).
	PrepareTimeout time.Duration
	// HealthTimeout is how long a health report holds (the kubelet's 30s).
	HealthTimeout time.Duration
	// TermTimeout bounds the wait for the driver to exit after SIGTERM.
	TermTimeout time.Duration
	// CallTimeout bounds waits for the API server and the other RPCs.
	CallTimeout time.Duration
	// Logger receives debug logs of the run, the emulated kubelet's among
	// them (at DEBUG, whatever their level: they are no findings), and a
	// warning for each object the run created on the API server that it
	// could not remove, with the command that removes it. Default:
	// discard.
	Logger *slog.Logger
	// Progress, when set, is called with each check's result as soon as
	// it is final, from the goroutine that called Run.
	Progress func(Result)
}

// Problems lists every problem in c with its field path.
func (c DRAConfig) Problems() field.ErrorList {
	var errs field.ErrorList
	if len(c.Command) == 0 {
		errs = append(errs, field.Required(field.NewPath("command"), "give the DRA driver command"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"registerTimeout", c.RegisterTimeout}, {"reregisterWarn", c.ReregisterWarn}, {"reregisterThreshold", c.ReregisterThreshold},
		{"prepareTimeout", c.PrepareTimeout}, {"healthTimeout", c.HealthTimeout}, {"termTimeout", c.TermTimeout}, {"callTimeout", c.CallTimeout},
	} {
		if d.v < 0 {
			errs = append(errs, field.Invalid(field.NewPath(d.name), d.v.String(), "must not be negative"))
		}
	}
	return errs
}

// Summarize counts the verdicts of results.
func Summarize(results []Result) Summary {
	var s Summary
	for _, r := range results {
		switch r.Verdict {
		case Pass:
			s.Passed++
		case Fail:
			s.Failed++
		case Warn:
			s.Warned++
		case Skip:
			s.Skipped++
		}
	}
	return s
}

// DRACleanupConfig configures dpkit verify --dra --cleanup, which removes
// what runs of dpkit verify --dra that no longer run left behind.
type DRACleanupConfig struct {
	// TempDir is where the runs' temporary roots are (dpvd*). Default
	// os.TempDir(), where a run makes its root.
	TempDir string
	// CallTimeout bounds each call to the API server and the waits for
	// what is deleted to go.
	CallTimeout time.Duration
	// Logger receives debug logs. Default: discard.
	Logger *slog.Logger
}

// What dpkit verify --dra --cleanup did with a thing it found
// (DRALeftover.Action).
const (
	// LeftoverRemoved: an object or directory of a run that has ended,
	// removed.
	LeftoverRemoved = "removed"
	// LeftoverKilled: a driver process of a run that has ended, killed.
	LeftoverKilled = "killed"
	// LeftoverKept: not removed since its run may still go on (it runs,
	// or on another host).
	LeftoverKept = "kept"
	// LeftoverFailed: of a run that has ended, but it could not be
	// removed; the detail says why and how to remove it.
	LeftoverFailed = "failed"
)

// DRALeftover is one thing of a run of dpkit verify --dra that
// --cleanup found.
type DRALeftover struct {
	// Run is the run's ID, the value of its objects' label
	// dpkit.io/verify-run.
	Run string `json:"run"`
	// Object names the thing: "Node dpkit-verify-x7k2qp", "directory
	// /tmp/dpvd123", "process 4242 (my-driver)".
	Object string `json:"object"`
	// Action is LeftoverRemoved, LeftoverKilled, LeftoverKept or
	// LeftoverFailed.
	Action string `json:"action"`
	// Detail says why it was kept or could not be removed.
	Detail string `json:"detail,omitempty"`
}

// DRACleanupReport is what dpkit verify --dra --cleanup found and did.
type DRACleanupReport struct {
	Leftovers []DRALeftover `json:"leftovers"`
}

// Failed reports whether anything of a run that has ended is left.
func (r *DRACleanupReport) Failed() bool {
	for _, l := range r.Leftovers {
		if l.Action == LeftoverFailed {
			return true
		}
	}
	return false
}
