// Package pluginrun runs the device plugins a PluginConfig describes, with
// their metrics and probes: what "dpkit plugin" and "dpkit up" run.
package pluginrun

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"

	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/probes"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/inventory"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
	"github.com/dpkit/dpkit/pkg/resourcename"
)

// Served is what RunWith started, handed to its Started callback.
type Served struct {
	// Server serves the device plugin fronts; nil when no resource has
	// one.
	Server *deviceplugin.Server
	// MetricsAddr is where metrics and probes listen; empty without.
	MetricsAddr string
	// DRADrivers names the DRA drivers started, one per resource with
	// the dra front.
	DRADrivers []string
	// Ready returns nil once every device plugin resource and every DRA
	// driver is registered with the kubelet: the readiness probe's answer.
	Ready func() error
}

// Started is called once RunWith has started everything.
type Started func(Served)

// ErrNoDRAFront is CheckFronts' error: this build serves resources only
// through the device plugin API.
var ErrNoDRAFront = errors.New("the DRA front is not available in this build of dpkit")

// DRAOptions are what the DRA front of one resource is started with.
type DRAOptions struct {
	DriverName  string
	NodeName    string
	PluginsDir  string
	RegistryDir string
	CDIDir      string
	SysfsRoot   string
	Kubeconfig  string
	// PodUID is $POD_UID, the UID of the pod the plugin runs in (the
	// downward API's metadata.uid): set, the front supports rolling
	// updates of its DaemonSet.
	PodUID string
	// Retired starts the front only for the claims the driver's
	// checkpoint lists (draplugin.Config.Retired): the resource is now
	// served through the device plugin API alone. The DRAFront returns a
	// DRADriver without Run when the checkpoint lists none.
	Retired bool
	// FollowAllocated says the device plugin front serves the resource
	// too and Options.FollowAllocated is set: the DRA front then holds a
	// claim's devices from its allocation on (draplugin.Config.Allocated),
	// so the device plugin front stops offering them before the kubelet
	// prepares the claim.
	FollowAllocated bool
}

// DRAFront starts the DRA front (pkg/draplugin) of one resource's inventory and
// returns what serves it until its context ends. dpkit-cluster has one
// (internal/drafront); the dpkit binary has none, since the front needs
// the Kubernetes client libraries.
type DRAFront func(inv *inventory.Inventory, o DRAOptions, log *slog.Logger, reg prometheus.Registerer) (DRADriver, error)

// DRADriver is a started DRA front: Run serves it until its context ends;
// Ready returns nil once the kubelet has registered it (the readiness
// probe's answer).
type DRADriver struct {
	Run   func(context.Context) error
	Ready func() error
}

// Options are what RunWith needs beyond the config.
type Options struct {
	// DRA starts DRA fronts; nil when this build has none.
	DRA DRAFront
	// Getenv reads the environment ($NODE_NAME, $POD_UID); nil means os.Getenv.
	Getenv func(string) string
	// Clock times the device plugin server (its retries, guards and
	// resyncs); nil means the real clock. Tests pass a fake one.
	Clock clock.WithTicker
	// NoClaimGuard serves a resource without the dra front as its plugin
	// offers it, without reading PodResources for claims of its driver
	// that hold devices (inventory.DevicePluginOnlyBesideDRA). For
	// callers that know no claim of the driver can be running beside it:
	// dpkit node's in-process plugins, thousands to a process, where
	// each guard would hold a PodResources connection.
	NoClaimGuard bool
	// FollowAllocated has the DRA front of a resource the device plugin
	// front serves too hold a claim's devices from its allocation on
	// (DRAOptions.FollowAllocated): what dpkit node gives its in-process
	// plugins, which share one claim informer. A plugin of its own (a
	// DaemonSet) does not: it would watch every claim of the cluster from
	// every node.
	FollowAllocated bool
	// InProcess is the kubelet in this process the device plugin fronts
	// register with, without sockets (deviceplugin.Config.InProcess):
	// dpkit node's device managers. nil registers as cfg says.
	InProcess deviceplugin.InProcessKubelet
}

// CheckFronts returns an error wrapping ErrNoDRAFront, naming the entries
// and the fix, when cfg asks for a front this build cannot serve
// (dra without a DRAFront). It is the one place that says which fronts a
// build serves.
func CheckFronts(cfg *config.PluginConfig, o Options) error {
	if o.DRA != nil {
		return nil
	}
	var entries []string
	for i, p := range cfg.Plugins {
		if slices.Contains(p.Fronts, config.FrontDRA) {
			entries = append(entries, fmt.Sprintf("plugins[%d].fronts", i))
		}
	}
	if len(entries) == 0 {
		return nil
	}
	return fmt.Errorf("%s: %w (it needs the Kubernetes client libraries: run it with dpkit-cluster, or the image ghcr.io/dpkit/dpkit); or remove dra from fronts to serve the resources through the device plugin API", strings.Join(entries, ", "), ErrNoDRAFront)
}

// Run serves cfg's plugins through the device plugin API until ctx ends,
// with metrics and probes on cfg.MetricsAddress when set. started may be
// nil; log may be nil. A config with the dra front is refused: that needs
// RunWith and a DRAFront.
func Run(ctx context.Context, log *slog.Logger, cfg *config.PluginConfig, started Started) error {
	return RunWith(ctx, log, cfg, started, Options{})
}

// RunWith serves cfg's plugins through their fronts until ctx ends: a
// resource with the device plugin front only is served by the SDK's
// server as it is (less what that API cannot offer:
// inventory.DevicePluginOnly); a resource with the dra front gets one inventory
// (pkg/inventory) that runs its Scan for both fronts and arbitrates
// between them, the DRA front started by o.DRA, and, with both fronts, the
// SDK's server serves the inventory's device plugin front.
func RunWith(ctx context.Context, log *slog.Logger, cfg *config.PluginConfig, started Started, o Options) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := CheckFronts(cfg, o); err != nil {
		return err
	}
	opts := cfg.HostOptions()
	opts.Logger = log
	resources, err := cfg.Resources(opts)
	if err != nil {
		return err
	}
	var reg *prometheus.Registry
	if cfg.MetricsAddress != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	served, runners, draReady, drivers, closeFronts, err := fronts(cfg, resources, o, log, reg)
	if err != nil {
		return err
	}
	defer closeFronts()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	g, ctx := errgroup.WithContext(ctx)
	for _, run := range runners {
		g.Go(func() error { return run(ctx) })
	}
	var srv *deviceplugin.Server
	dpReady := func() error { return nil }
	if len(served) > 0 {
		dpCfg := deviceplugin.Config{
			PluginDir:    cfg.PluginDir,
			Registration: deviceplugin.RegistrationMode(cfg.Registration),
			RegistryDir:  cfg.RegistryDir,
			InProcess:    o.InProcess,
			Logger:       log,
			Clock:        o.Clock,
		}
		if o.InProcess != nil {
			dpCfg.Registration = deviceplugin.RegistrationInProcess
		}
		if reg != nil {
			dpCfg.Registerer = reg
		}
		srv, err = deviceplugin.NewServer(dpCfg, served...)
		if err != nil {
			return err
		}
		dpReady = srv.Ready
	}
	// Ready when every device plugin resource and every DRA driver is
	// registered with the kubelet.
	ready := func() error {
		errs := []error{dpReady()}
		for _, r := range draReady {
			errs = append(errs, r())
		}
		return errors.Join(errs...)
	}
	addr := ""
	if reg != nil {
		ps, err := probes.Listen(cfg.MetricsAddress, reg, ready, log)
		if err != nil {
			return err
		}
		addr = ps.Addr()
		log.Info("Serving metrics and probes", "address", addr)
		g.Go(func() error { return ps.Serve(ctx) })
	}
	if started != nil {
		started(Served{Server: srv, MetricsAddr: addr, DRADrivers: drivers, Ready: ready})
	}
	if srv == nil {
		return g.Wait()
	}
	// The server runs on this goroutine rather than one more that this
	// one waits for: one fewer for each node of a process.
	err = srv.Run(ctx)
	if err != nil {
		cancel(err)
	}
	if werr := g.Wait(); err == nil {
		return werr
	}
	return err
}

// fronts returns the resources the device plugin server serves and the
// runners of the inventories and DRA fronts of the resources that have the
// dra front.
func fronts(cfg *config.PluginConfig, resources []deviceplugin.Resource, o Options, log *slog.Logger, reg *prometheus.Registry) (served []deviceplugin.Resource, runners []func(context.Context) error, ready []func() error, drivers []string, closeAll func(), err error) {
	closeAll = func() {}
	byName := map[string]config.ResourceFront{}
	for _, f := range cfg.Fronts() {
		byName[f.Resource] = f
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	usesDRA := cfg.UsesFront(config.FrontDRA)
	if !usesDRA && o.NoClaimGuard {
		for _, r := range resources {
			served = append(served, devicePluginOnly(r))
		}
		return served, nil, nil, nil, closeAll, nil
	}
	// The DRA fronts register where the device plugins do, and find the
	// kubelet's other directories beside theirs.
	pluginDir, registryDir := deviceplugin.Config{PluginDir: cfg.PluginDir, RegistryDir: cfg.RegistryDir}.Dirs()
	dra := cfg.DRA.Resolve(getenv, pluginDir)
	// The kubelet's PodResources API says which devices containers still
	// hold through the device plugin front, and which claims hold.
	lister, conn, err := prclient.New(dra.PodResourcesSocket)
	if err != nil {
		return nil, nil, nil, nil, closeAll, err
	}
	closeAll = func() { _ = conn.Close() }
	fail := func(err error) ([]deviceplugin.Resource, []func(context.Context) error, []func() error, []string, func(), error) {
		closeAll()
		return nil, nil, nil, nil, func() {}, err
	}
	var guardOpts []inventory.Option
	if o.Clock != nil {
		guardOpts = append(guardOpts, inventory.WithClock(o.Clock))
	}
	if _, err := os.Stat(dra.PodResourcesSocket); errors.Is(err, fs.ErrNotExist) {
		// No kubelet here yet, or one without the API: nothing to wait
		// for before the first report.
		guardOpts = append(guardOpts, inventory.WithFirstAnswerWait(0))
	}
	node, nodeErr := cfg.DRA.Node(getenv)
	if usesDRA && nodeErr != nil {
		return fail(nodeErr)
	}
	// host.sysfsRoot may be relative (the node profiles' fixture hosts);
	// the DRA front wants it whole.
	sysfsRoot := cfg.Host.SysfsRoot
	if sysfsRoot != "" {
		if sysfsRoot, err = filepath.Abs(sysfsRoot); err != nil {
			return fail(fmt.Errorf("host.sysfsRoot: %w", err))
		}
	}
	var registerer prometheus.Registerer
	if reg != nil {
		registerer = reg
	}
	for _, r := range resources {
		f, ok := byName[r.Name]
		if !ok {
			f = config.ResourceFront{Resource: r.Name, Fronts: []string{config.FrontDevicePlugin}, DriverName: resourcename.DriverName(r.Name)}
		}
		rlog := log.With("resource", r.Name)
		draOpts := DRAOptions{
			DriverName:  f.DriverName,
			NodeName:    node,
			PluginsDir:  dra.PluginsDir,
			RegistryDir: registryDir,
			CDIDir:      dra.CDIDir,
			SysfsRoot:   sysfsRoot,
			Kubeconfig:  cfg.DRA.Kubeconfig,
			PodUID:      getenv(config.EnvPodUID),
		}
		if !f.Has(config.FrontDRA) {
			if inv, drv, ok := retired(r, draOpts, nodeErr, lister, o, rlog, registerer); ok {
				// Claims an instance with the dra front prepared are
				// still held: the driver stays to unprepare them, and
				// the arbiter keeps their devices from the device
				// plugin front until then.
				runners = append(runners, inv.Run, drv.Run)
				served = append(served, deviceplugin.Resource{Name: r.Name, Plugin: inv.DevicePluginFront()})
				continue
			}
			served = append(served, guarded(r, f.DriverName, lister, o, rlog, guardOpts))
			continue
		}
		inv := inventory.New(r.Name, r.Plugin, rlog, inventory.WithPodResources(lister))
		runners = append(runners, inv.Run)
		if f.Has(config.FrontDevicePlugin) {
			served = append(served, deviceplugin.Resource{Name: r.Name, Plugin: inv.DevicePluginFront()})
			draOpts.FollowAllocated = o.FollowAllocated
		}
		drv, err := o.DRA(inv, draOpts, rlog, registerer)
		if err != nil {
			return fail(fmt.Errorf("the DRA front of %s (driver %s): %w", r.Name, f.DriverName, err))
		}
		runners = append(runners, drv.Run)
		ready = append(ready, drv.Ready)
		drivers = append(drivers, f.DriverName)
		rlog.Info("Serving through DRA", "driver", f.DriverName, "node", node, "deviceplugin", f.Has(config.FrontDevicePlugin))
	}
	return served, runners, ready, drivers, closeAll, nil
}

// DRACheckpointFile is the name of a DRA driver's checkpoint in
// <plugins dir>/<driver>: draplugin.CheckpointFile (internal/drafront's
// tests keep them equal; this package cannot import draplugin).
const DRACheckpointFile = "checkpoint.json"

// retired starts the DRA front of r, served through the device plugin
// front alone, in its retired mode (DRAOptions.Retired) when the
// driver's checkpoint lists claims that an instance with the dra front
// prepared: a direct switch from [dra] to [deviceplugin]. The kubelet
// can then still unprepare them and end their pods, and the device
// plugin front is the inventory's, which keeps their devices. ok is
// false when there is nothing to keep, or no way to (a build without the
// DRA front, no node name, a front that cannot start: said once, and the
// resource is guarded through PodResources instead).
func retired(r deviceplugin.Resource, draOpts DRAOptions, nodeErr error, lister inventory.PodResourcesLister, o Options, log *slog.Logger, reg prometheus.Registerer) (*inventory.Inventory, DRADriver, bool) {
	if o.DRA == nil || o.NoClaimGuard {
		return nil, DRADriver{}, false
	}
	if _, err := os.Stat(filepath.Join(draOpts.PluginsDir, draOpts.DriverName, DRACheckpointFile)); err != nil {
		return nil, DRADriver{}, false
	}
	warn := func(err error) {
		log.Warn("The DRA driver's checkpoint is here, but its retired front cannot start to unprepare the claims it lists: their pods stay Terminating until a front of the driver serves again; their devices are withheld from the device plugin API while the kubelet lists them",
			"driver", draOpts.DriverName, "err", err,
			"fix", "serve the resource with fronts [deviceplugin, dra] until those pods are gone")
	}
	if nodeErr != nil {
		warn(nodeErr)
		return nil, DRADriver{}, false
	}
	draOpts.Retired = true
	inv := inventory.New(r.Name, r.Plugin, log, inventory.WithPodResources(lister))
	drv, err := o.DRA(inv, draOpts, log, reg)
	if err != nil {
		warn(err)
		return nil, DRADriver{}, false
	}
	if drv.Run == nil {
		return nil, DRADriver{}, false // the checkpoint lists no claim
	}
	log.Info("Serving through the device plugin API; the DRA driver stays, retired, for the claims prepared before", "driver", draOpts.DriverName)
	return inv, drv, true
}

// guarded serves r through the device plugin API alone, withholding what
// claims of its DRA driver hold (inventory.DevicePluginOnlyBesideDRA):
// pods whose claims an instance with the dra front prepared keep their
// devices after a switch to [deviceplugin], and during a rolling update
// beside such an instance. NoClaimGuard serves it as devicePluginOnly.
func guarded(r deviceplugin.Resource, driver string, lister inventory.PodResourcesLister, o Options, log *slog.Logger, opts []inventory.Option) deviceplugin.Resource {
	if o.NoClaimGuard {
		return devicePluginOnly(r)
	}
	return deviceplugin.Resource{Name: r.Name, Plugin: inventory.DevicePluginOnlyBesideDRA(r.Plugin, driver, lister, log, opts...)}
}

// devicePluginOnly serves r through the device plugin API alone: its
// replicas, not the shared devices they draw on, and no DRA-only devices.
func devicePluginOnly(r deviceplugin.Resource) deviceplugin.Resource {
	return deviceplugin.Resource{Name: r.Name, Plugin: inventory.DevicePluginOnly(r.Plugin)}
}
