package verify

import (
	"log/slog"
	"os"
	"strings"
	"syscall"
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
)

// DRAChecks returns every check of dpkit verify --dra in the order they
// are reported.
func DRAChecks() []CheckInfo {
	return infos([]checkText{
		{CheckDRARegistration, "the driver registers through plugins_registry: GetInfo type DRAPlugin, a valid name, service names as versions, an endpoint under the plugins directory",
			"the kubelet's plugin watcher calls GetInfo on every socket in plugins_registry, hands type DRAPlugin to the DRA manager, which needs a supported service (v1.DRAPlugin) among the versions, and reports the outcome with NotifyRegistrationStatus",
			"serve the registration socket in $DPKIT_REGISTRY_DIR (<driver>-reg.sock) and answer GetInfo with type `DRAPlugin`, your driver name, the endpoint <plugins dir>/<driver>/dra.sock and the versions `v1.DRAPlugin` (and `v1.DRAResourceHealth` if you serve health)."},
		{CheckDRAKubeletRestart, "after a kubelet restart the driver is registered again within the threshold (warns above --reregister-warn)",
			"a restarting kubelet's plugin watcher finds the registration socket again and calls GetInfo and NotifyRegistrationStatus; a driver that answers only once stays unregistered and its claims cannot be prepared",
			"keep the registration server running for the life of the driver and answer GetInfo every time it is asked."},
		{CheckDRADriverRestart, "a driver killed without cleaning up (stale sockets left) starts again and registers within the threshold (warns above --reregister-warn)",
			"a DaemonSet pod is restarted after a crash or an update; the sockets of the old instance stay behind, and only a new registration brings the driver back to the kubelet",
			"remove a stale socket file before listening on its path (the kubeletplugin helper does, and so pkg/draplugin), and register as soon as the gRPC servers run."},
		{CheckDRASlices, "the ResourceSlices are valid: spec.nodeName and the Node as owner, at most 128 devices per slice, one pool generation, resourceSliceCount slices",
			"the scheduler allocates only from complete pools of the newest generation, and the kubelet (and the Node's deletion) remove the slices of a node by spec.nodeName and the owner reference",
			"publish with spec.nodeName set to $NODE_NAME and an owner reference to the Node, split the devices into slices of at most 128, and give every slice of the pool the same generation and resourceSliceCount."},
		{CheckDRASlicesRestart, "after the driver's restart its ResourceSlices list the same devices, with a pool generation not below the old one",
			"the scheduler drops pools whose generation goes backwards or whose slices are incomplete",
			"on start, read the existing slices of your pool and update them in place; when they change, increase the pool generation."},
		{CheckDRAGeneration, "whenever the devices a ResourceSlice lists change, the pool's generation goes up",
			"the scheduler and the kubelet tell an updated pool from a stale one by its generation; slices of one generation with different devices make a pool inconsistent, and the scheduler may allocate a device that is gone or changed",
			"bump the pool's generation in every slice of the pool on each change of any of its devices (attributes, capacity, taints included)."},
		{CheckDRASlicesRemoved, "after the driver exits its ResourceSlices are removed, by the driver or (reported) left to the kubelet",
			"the kubelet deletes a driver's ResourceSlices on its node when the driver stays unregistered; until then the scheduler may place pods on devices no driver serves",
			"nothing to do: the kubelet removes the slices of an unregistered driver; a driver that is uninstalled may delete its slices itself."},
		{CheckDRAPrepare, "NodePrepareResources answers one result per claim, with the allocated devices",
			"the kubelet looks each claim's result up by UID and fails the pod when one is missing (\"NodePrepareResources left out %d claims\")",
			"return a NodePrepareResourceResponse for every claim of the request, keyed by its UID."},
		{CheckDRAIdempotent, "preparing a prepared claim again succeeds with the same devices",
			"the kubelet calls NodePrepareResources again for a claim it has prepared (container restarts, a second pod sharing the claim, a kubelet restart) and expects the same answer",
			"keep what you prepared (a checkpoint) and answer a repeated Prepare from it."},
		{CheckDRAPerClaimError, "a claim that cannot be prepared gets a per-claim error and the others of the request still succeed",
			"the kubelet batches the claims of a pod into one call; an error for the whole call fails every claim in it",
			"return a per-claim `error` in its result, never a gRPC error, for a problem with one claim."},
		{CheckDRAUnknownClaim, "NodeUnprepareResources of a claim the driver never prepared succeeds",
			"the kubelet unprepares claims again after its restart and after a failed Prepare; an error makes it retry forever and keeps the pod from being removed",
			"treat unpreparing an unknown claim as done."},
		{CheckDRACDI, "every CDI device ID a Prepare returns is defined in a CDI spec file in $DPKIT_CDI_DIR that parses",
			"the kubelet passes the CDI IDs to the container runtime, which fails the container when a device is not in its CDI specs",
			"write the spec (tags.cncf.io/container-device-interface) to the CDI directory before answering Prepare, and return IDs of the form vendor/class=device naming its devices."},
		{CheckDRAReboot, "after a reboot (CDI directory wiped, driver restarted) Prepare of a checkpointed claim writes its CDI spec again",
			"/var/run/cdi is a tmpfs emptied by a reboot while the kubelet's and the driver's checkpoints survive; the kubelet prepares the claim again and the runtime needs the spec (kubernetes#141433)",
			"when answering Prepare from your checkpoint, check that the CDI spec file exists and write it again if not."},
		{CheckDRASharedDevice, "a device prepared for one claim is refused for another (no admin access, no allowMultipleAllocations)",
			"the scheduler gives a device to one claim at a time unless the device allows multiple allocations or the request has admin access; a second claim for it is a stale or broken allocation",
			"keep which claim holds each device and return a per-claim error for a second claim of a held device, unless the device allows multiple allocations or the request has admin access."},
		{CheckDRATimeout, "every NodePrepareResources and NodeUnprepareResources call is answered within --prepare-timeout (45s)",
			"the kubelet gives each call to a driver 45s and fails the pod's start when it runs out",
			"do slow device set-up in the background or in advance; answer Prepare from what is ready."},
		{CheckDRAHealth, "when the driver serves DRAResourceHealth, the stream opens, reports the published devices, and reports them again before --health-timeout",
			"the kubelet marks a device's health Unknown when no report for it arrived within the health timeout (30s), and shows it in pods' status",
			"send the health of every published device when a stream opens and again at least every half of the health timeout."},
		{CheckDRAExit, "the driver exits soon after SIGTERM and removes its sockets",
			"a DaemonSet pod is stopped with SIGTERM and killed after its grace period; a socket left behind is dialled by the kubelet until it is replaced",
			"handle SIGTERM (`signal.NotifyContext`), stop the gRPC servers and remove your sockets."},
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

// Environment variables set for a DRA driver command (dpkit verify --dra).
// EnvRegistryDir names the plugins_registry directory.
const (
	// EnvDRAPluginsDir names the kubelet's plugins directory, where the
	// driver serves <dir>/<driver>/dra.sock.
	EnvDRAPluginsDir = "DPKIT_DRA_PLUGINS_DIR"
	// EnvCDIDir names the CDI spec directory.
	EnvCDIDir = "DPKIT_CDI_DIR"
	// EnvNodeName names the node the driver publishes for.
	EnvNodeName = "NODE_NAME"
	// EnvKubeconfig names the API server's client configuration.
	EnvKubeconfig = "KUBECONFIG"
)

// Placeholders replaced in a DRA driver command's arguments.
const (
	PlaceholderPluginsDir = "{plugins-dir}"
	PlaceholderCDIDir     = "{cdi-dir}"
	PlaceholderNodeName   = "{node-name}"
	PlaceholderKubeconfig = "{kubeconfig}"
)

// DRAConfig configures a run of dpkit verify --dra.
type DRAConfig struct {
	// Command is the driver command and its arguments; the placeholders
	// {registry-dir}, {plugins-dir}, {cdi-dir}, {node-name} and
	// {kubeconfig} are replaced. Required.
	Command []string
	// Kubeconfig is the API server's client configuration file; empty:
	// $KUBECONFIG, ~/.kube/config, in-cluster.
	Kubeconfig string
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

// WithDefaults returns c with every zero field set to its default.
func (c DRAConfig) WithDefaults() DRAConfig {
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&c.RegisterTimeout, DefaultDRARegisterTimeout)
	set(&c.ReregisterWarn, DefaultDRAReregisterWarn)
	set(&c.ReregisterThreshold, DefaultDRAReregisterThreshold)
	set(&c.PrepareTimeout, DefaultPrepareTimeout)
	set(&c.HealthTimeout, DefaultDRAHealthTimeout)
	set(&c.TermTimeout, DefaultTermTimeout)
	set(&c.CallTimeout, DefaultCallTimeout)
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Problems lists every problem in c with its field path.
func (c DRAConfig) Problems() field.ErrorList {
	var errs field.ErrorList
	if len(c.Command) == 0 {
		errs = append(errs, field.Required(field.NewPath("command"), "give the DRA driver command after --, e.g. dpkit verify --dra -- my-driver"))
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

// Process is a command run under verify: in its own process group, with
// the end of its output kept. The DRA checker (pkg/verify/draverify) runs
// drivers with it.
type Process struct{ p *process }

// StartProcess starts command with env.
func StartProcess(command, env []string) (*Process, error) {
	p, err := startProcess(command, env, "", false)
	if err != nil {
		return nil, err
	}
	return &Process{p}, nil
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error { return p.p.signal(sig) }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.p.done }

// Kill kills the process group and waits for the process.
func (p *Process) Kill() { p.p.kill() }

// Output is the end of what the process wrote.
func (p *Process) Output() string { return p.p.out.String() }

// Exit says how the process ended ("exited with status 2"); "" while it
// runs.
func (p *Process) Exit() string {
	select {
	case <-p.p.done:
		return exitDescription(p.p.err)
	default:
		return ""
	}
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

// FinalResult is res as a report gives it: with the check's fix and the
// link to its section when it failed or warned.
func (c CheckInfo) FinalResult(res Result) Result {
	res.ID, res.Description, res.Basis = c.ID, c.Description, c.Basis
	if res.Verdict == Fail || res.Verdict == Warn {
		res.Fix, res.Docs = c.Fix, c.DocsURL()
	}
	return res
}

// DRAMode is Report.Mode for dpkit verify --dra.
const DRAMode = "dra"

// ExpandDRAArgs replaces the DRA placeholders (keys of vals) in args.
func ExpandDRAArgs(args []string, vals map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for k, v := range vals {
			a = strings.ReplaceAll(a, k, v)
		}
		out[i] = a
	}
	return out
}
