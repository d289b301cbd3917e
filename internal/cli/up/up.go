// Package up implements "dpkit up": an emulated kubelet and device plugins
// (by default the fake plugin of examples/fake.yaml) in one process, rooted
// in a fresh directory, with what to try next. It is the first thing a new
// user runs; it needs no cluster and no privileges.
package up

import (
	"context"
	_ "embed" // the default plugin config and example pod
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"
	"sigs.k8s.io/yaml"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/internal/rootlock"
	"github.com/dpkit/dpkit/pkg/devicemanager"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
	"github.com/dpkit/dpkit/pkg/discovery/numa"
	"github.com/dpkit/dpkit/pkg/dramanager"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/topology"
)

// defaultConfig is examples/fake.yaml (a test keeps the two equal).
//
//go:embed fake.yaml
var defaultConfig []byte

// examplePod is examples/pod.yaml (a test keeps the two equal), written
// below the root when examples/pod.yaml is not in the working directory.
//
//go:embed pod.yaml
var examplePod []byte

// readyPrefix starts the line "dpkit up" prints once every plugin is
// registered and its devices are allocatable.
const readyPrefix = "ready:"

// options configure runUp.
type options struct {
	// Root is the kubelet root directory. Empty: a fresh temporary
	// directory, removed on exit unless Keep is set.
	Root string
	// Keep keeps a temporary root on exit.
	Keep bool
	// ConfigFile is a PluginConfig file; empty runs the fake plugin of
	// examples/fake.yaml.
	ConfigFile string
	// Registration overrides how the plugins register: kubelet (Register
	// on kubelet.sock), registry (a socket in plugins_registry) or auto.
	// Empty: the config file's registration when it sets one, else
	// kubelet.
	Registration string
	// Topology configures the device manager's topology policy, as for
	// "dpkit kubelet".
	Topology cli.Topology
	// Command is how the printed commands invoke dpkit. Default "dpkit".
	Command string
	// WorkDir is where relative example paths are resolved. Default: the
	// working directory.
	WorkDir string
	// HostRoot, when set, is where the plugins read the host's sys/, dev/
	// and proc/ instead of /sys, /dev and /proc: a fixture tree, to try a
	// plugin without its hardware.
	HostRoot string
	// Kubeconfig names the API server the DRA manager reads claims from
	// (through Env.Cluster); empty: pods with claims are refused.
	Kubeconfig string
	// claims is the DRA manager's claim source, from Kubeconfig.
	claims dramanager.ClaimGetter
	// allocator allocates them (with Kubeconfig).
	allocator emulator.ClaimAllocator
	// NodeName is the node the emulated kubelet is (--node-name).
	NodeName string
	// draFront serves the config's DRA fronts (from Env.Cluster, with
	// Kubeconfig); nil: a config with a DRA front is refused.
	draFront pluginrun.DRAFront
	// clock times the plugins' device plugin server; nil: the real clock.
	clock clock.WithTicker
}

// NewCommand returns the "up" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var o options
	cmd := &cobra.Command{
		Use:   "up [--config FILE] [--root DIR]",
		Short: "Run an emulated kubelet and the fake device plugin in one process, to try dpkit without a cluster",
		Long: `Run an emulated kubelet (as "dpkit kubelet") and device plugins (as "dpkit
plugin") in one process, without a cluster or privileges. By default the
plugin is the fake plugin of examples/fake.yaml: example.com/foo with 8
devices; --config runs the plugins of a PluginConfig file instead.

The plugins register the way they do on a real node: each serves its
socket in <root>/device-plugins and calls Register on
<root>/device-plugins/kubelet.sock (--registration registry uses the plugin
watcher's <root>/plugins_registry instead).

With --kubeconfig, the ResourceClaims of pods admitted with "dpkit admit"
are read from that API server and prepared through the DRA drivers
registered in <root>/plugins_registry, as "dpkit kubelet --kubeconfig"
does: claims not allocated yet are allocated for --node-name (default the
host's name) with the scheduler's allocator from the published
ResourceSlices and reserved for the pod, and "dpkit delete" gives them
back. No scheduler need run.

The root is a fresh temporary directory, removed on exit, unless --root is
given or --keep is set. "dpkit up" prints where everything listens, a line
starting with "ready:" once every plugin's devices are allocatable, and
commands to try next. It stops on SIGINT or SIGTERM and removes its
sockets.`,
		Example: `  dpkit up
  dpkit up --root /tmp/kubelet --config examples/generic.yaml
  dpkit up --keep --log-level info
  dpkit up --config examples/nvidia.yaml --host-root pkg/discovery/testdata/hosts/dgx-h100`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch o.Registration {
			case "", string(deviceplugin.RegistrationAuto), string(deviceplugin.RegistrationKubelet), string(deviceplugin.RegistrationRegistry):
			default:
				return cli.Exit(2, fmt.Errorf("--registration: %q is not a registration path; use kubelet, registry or auto", o.Registration))
			}
			if err := o.Topology.Validate(); err != nil {
				return err
			}
			if cmd.Flags().Changed("root") && o.Root == "" {
				return cli.Exit(2, errors.New("--root must not be empty; leave it out for a temporary root"))
			}
			if o.Command == "" {
				o.Command = selfCommand()
			}
			if o.Kubeconfig != "" {
				claims, alloc, err := claimsFrom(env, o.Kubeconfig)
				if err != nil {
					return err
				}
				o.claims, o.allocator = claims, alloc
				o.draFront = env.Cluster.DRAFront()
			}
			log := env.Logger
			if f := cmd.Flags().Lookup("log-level"); log != nil && (f == nil || !f.Changed) {
				// The banner says what a new user needs; logs below warnings
				// only on request.
				log = slog.New(minLevel{log.Handler(), slog.LevelWarn})
			}
			return runUp(cmd.Context(), &cli.Env{In: env.In, Out: env.Out, Err: env.Err, Logger: log, Getenv: env.Getenv}, o)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Root, "root", "", "kubelet root directory (default: a fresh temporary directory, removed on exit)")
	fl.BoolVar(&o.Keep, "keep", false, "keep the temporary root directory on exit")
	fl.StringVarP(&o.ConfigFile, "config", "c", "", "PluginConfig file of the plugins to run (default: the fake plugin of examples/fake.yaml)")
	fl.StringVar(&o.Registration, "registration", "", "how plugins register: kubelet, registry or auto (default: the config's, else kubelet)")
	o.Topology.AddFlags(cmd)
	fl.StringVar(&o.Kubeconfig, "kubeconfig", "", "read the ResourceClaims of admitted pods from the API server of this kubeconfig, allocate those not allocated for --node-name with the scheduler's allocator, and prepare them through their DRA drivers (runs dpkit-cluster; default: pods with claims are refused)")
	fl.StringVar(&o.NodeName, "node-name", "", "the node this kubelet is: claims are allocated from the devices published for it (default: the host's name)")
	fl.StringVar(&o.HostRoot, "host-root", "", "read the host's devices below DIR/sys, DIR/dev and DIR/proc, e.g. a fixture host under pkg/discovery/testdata/hosts (default: /sys, /dev, /proc)")
	cmd.SetFlagErrorFunc(cli.FlagError)
	return cmd
}

// runUp runs the emulated kubelet and the plugins until ctx ends, printing
// to env.Out where they listen and, once every plugin is registered, a
// line starting with ReadyPrefix and what to try next. It returns nil when
// ctx ends, after the sockets are removed (and a temporary root with
// them).
func runUp(ctx context.Context, env *cli.Env, o options) (err error) {
	log := env.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg, err := loadConfig(o.ConfigFile, o.Registration)
	if err != nil {
		return cli.Exit(2, err)
	}
	if err := setHostRoot(cfg, o.HostRoot); err != nil {
		return cli.Exit(2, err)
	}
	if cfg.DRA.Kubeconfig == "" {
		cfg.DRA.Kubeconfig = o.Kubeconfig
	}
	if cfg.UsesFront(config.FrontDRA) && o.draFront == nil {
		return cli.Exit(2, fmt.Errorf("%s: a DRA front publishes ResourceSlices on an API server: add --kubeconfig FILE (pods' claims are then allocated and prepared too), or remove dra from the plugins' fronts", frontsField(cfg)))
	}
	if o.Command == "" {
		o.Command = "dpkit"
	}
	root, temporary := o.Root, o.Root == ""
	if temporary {
		if root, err = os.MkdirTemp("", "dpkit-up-"); err != nil {
			return fmt.Errorf("creating a temporary root: %w", err)
		}
	} else {
		if root, err = filepath.Abs(root); err != nil {
			return fmt.Errorf("--root: %w", err)
		}
		if err := os.MkdirAll(root, 0o750); err != nil {
			return fmt.Errorf("--root: %w", err)
		}
	}
	defer func() {
		switch {
		case !temporary:
		case o.Keep:
			fmt.Fprintf(env.Out, "kept %s\n", root)
		default:
			if rerr := os.RemoveAll(root); rerr != nil {
				err = errors.Join(err, fmt.Errorf("removing the temporary root: %w", rerr))
				return
			}
			fmt.Fprintf(env.Out, "removed %s\n", root)
		}
	}()
	// One emulator per root: a second one would replace this one's
	// sockets, and remove them when it stops.
	lock, err := rootlock.Acquire(root)
	if err != nil {
		return err
	}
	defer func() { _ = lock.Release() }()
	cfg.PluginDir = devicemanager.PluginDir(root)
	cfg.RegistryDir = filepath.Join(root, "plugins_registry")

	w := &printer{w: env.Out}
	w.printf("dpkit up: an emulated kubelet and %s in one process; no cluster needed.\n\n", describe(o.ConfigFile))
	switch {
	case !temporary:
		w.printf("root                %s\n", root)
	case o.Keep:
		w.printf("root                %s (temporary, kept on exit)\n", root)
	default:
		w.printf("root                %s (temporary: removed on exit; --keep keeps it)\n", root)
	}

	g, gctx := errgroup.WithContext(ctx)
	// On a stop the plugins stop first, then the kubelet. A plugin that
	// stops ends its registration loop before its ListAndWatch streams,
	// and the device manager takes a stream the plugin ends as the plugin
	// leaving; the other way round, each plugin would see the kubelet
	// vanish and log its failed attempt to register again. So a clean
	// stop logs nothing above INFO (docs/dpkit-up.md).
	kctx, stopKubelet := context.WithCancel(context.WithoutCancel(gctx))
	defer stopKubelet()
	kubeletStarted := make(chan *emulator.Emulator, 1)
	g.Go(func() error {
		return emulator.Run(kctx, emulator.Options{
			Root:           root,
			TopologyPolicy: o.Topology.Policy,
			TopologyScope:  o.Topology.Scope,
			NUMANodes:      o.Topology.NUMANodes,
			SysfsRoot:      o.Topology.SysfsRoot,
			RootLocked:     true,
			Logger:         log,
			Claims:         o.claims,
			Allocator:      o.allocator,
			NodeName:       o.NodeName,
		}, func(e *emulator.Emulator) { kubeletStarted <- e })
	})
	g.Go(func() error {
		// The kubelet stops once the plugins have (or at once when it
		// never started).
		defer stopKubelet()
		var e *emulator.Emulator
		select {
		case e = <-kubeletStarted:
		case <-gctx.Done():
			return nil
		}
		// "dpkit get", "admit" and "delete" find this root without --root
		// while it runs.
		if err := emulator.RecordRoot(root, env.Var); err != nil {
			log.Warn("Cannot record the root for the client commands", "err", err)
		}
		mgr := e.Manager()
		w.printf("registration        %s\n", mgr.SocketPath())
		w.printf("plugins_registry    %s\n", cfg.RegistryDir)
		w.printf("PodResources API    %s\n", podresources.SocketPath(root))
		w.printf("admin API           %s\n", emulator.AdminSocket(root))
		w.printf("checkpoint          %s\n", mgr.CheckpointPath())
		w.printf("topology            %s\n\n", describeTopology(o.Topology, e.NUMANodes()))

		pg, pctx := errgroup.WithContext(gctx)
		started := make(chan pluginrun.Served, 1)
		pg.Go(func() error {
			return pluginrun.RunWith(pctx, log.With("component", "plugin"), cfg, func(s pluginrun.Served) { started <- s }, pluginrun.Options{
				Clock:  o.clock,
				DRA:    o.draFront,
				Getenv: draEnv(env.Var, root, e.NodeName()),
			})
		})
		pg.Go(func() error {
			var s pluginrun.Served
			select {
			case s = <-started:
			case <-pctx.Done():
				return nil
			}
			if s.Server != nil {
				w.printf("waiting for the plugins to register (%s)...\n", s.Server.Mode())
				if err := waitServed(pctx, mgr, s.Server); err != nil {
					return nil // ctx ended: the group's error or the signal says why
				}
			}
			if len(s.DRADrivers) > 0 {
				w.printf("waiting for the DRA drivers to register (plugins_registry)...\n")
				if err := waitDRA(pctx, s.Ready); err != nil {
					return nil
				}
			}
			resources := mgr.Resources()
			examples, err := examplePods(root, o.WorkDir, resources)
			if err != nil {
				return err
			}
			w.printReady(root, o.Command, s, resources, examples, e.NodeName(), o.Kubeconfig)
			return w.err
		})
		return pg.Wait()
	})
	err = g.Wait()
	if err == nil {
		w.printf("\nstopped\n")
		err = w.err
	}
	return err
}

// loadConfig reads the PluginConfig (the embedded fake one when path is
// empty) and settles how its plugins register.
func loadConfig(path, registration string) (*config.PluginConfig, error) {
	data := defaultConfig
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("--config %s: the file does not exist", path)
			}
			return nil, fmt.Errorf("--config %s: %w", path, err)
		}
	}
	cfg, err := config.DecodePluginConfig(data)
	if err != nil {
		if path == "" {
			return nil, fmt.Errorf("the embedded fake plugin config: %w", err)
		}
		return nil, fmt.Errorf("--config %s:\n%w", path, err)
	}
	if registration == "" {
		// The config's own choice when it makes one; else the classic
		// path every device plugin knows.
		var set struct {
			Registration string `json:"registration"`
		}
		_ = yaml.Unmarshal(data, &set)
		registration = set.Registration
		if registration == "" {
			registration = string(deviceplugin.RegistrationKubelet)
		}
	}
	cfg.Registration = registration
	return cfg, nil
}

// setHostRoot points the plugins at the sys/, dev/ and proc/ of dir,
// when dir is set. It must be a directory with sys/ or dev/.
func setHostRoot(cfg *config.PluginConfig, dir string) error {
	if dir == "" {
		return nil
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("--host-root %s: not a directory; give a tree with sys/, dev/ and proc/ as on a host, e.g. pkg/discovery/testdata/hosts/dgx-h100", dir)
	}
	_, errSys := os.Stat(filepath.Join(dir, "sys"))
	_, errDev := os.Stat(filepath.Join(dir, "dev"))
	if errSys != nil && errDev != nil {
		return fmt.Errorf("--host-root %s: has neither sys/ nor dev/; give a tree with sys/, dev/ and proc/ as on a host, e.g. pkg/discovery/testdata/hosts/dgx-h100", dir)
	}
	cfg.Host.SysfsRoot = filepath.Join(dir, "sys")
	cfg.Host.DevRoot = filepath.Join(dir, "dev")
	cfg.Host.ProcRoot = filepath.Join(dir, "proc")
	return nil
}

func describe(configFile string) string {
	if configFile == "" {
		return "the fake device plugin (example.com/foo, 8 devices)"
	}
	return "the device plugins of " + configFile
}

// describeTopology says which topology policy the device manager applies,
// in which scope, on which NUMA nodes and where they come from.
func describeTopology(t cli.Topology, nodes []int) string {
	s := "policy " + t.Policy
	if t.Policy != topology.PolicyNone {
		s += ", scope " + t.Scope
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = strconv.Itoa(n)
	}
	switch {
	case len(t.NUMANodes) > 0:
		return s + ", NUMA nodes " + strings.Join(ids, ",") + " (--numa-nodes)"
	case len(nodes) > 0:
		return s + ", NUMA nodes " + strings.Join(ids, ",") + " (from " + filepath.Join(t.SysfsRoot, numa.NodesDir) + ")"
	}
	return s + ", no NUMA nodes found in " + filepath.Join(t.SysfsRoot, numa.NodesDir)
}

// waitDRA waits until ready (every DRA driver registered with the
// emulated kubelet) returns nil. Registration is the plugin watcher's,
// which says nothing when it happens: ready is asked every 50ms.
func waitDRA(ctx context.Context, ready func() error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for ready() != nil {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// waitServed waits until every resource of srv is registered and the
// device manager lists all of its devices.
func waitServed(ctx context.Context, mgr *devicemanager.Manager, srv *deviceplugin.Server) error {
	if err := srv.WaitReady(ctx); err != nil {
		return err
	}
	updates, unsubscribe := mgr.Subscribe()
	defer unsubscribe()
	for {
		if served(mgr.Resources(), srv.Status()) {
			return nil
		}
		select {
		case _, ok := <-updates:
			if !ok {
				return devicemanager.ErrNotStarted
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func served(have []devicemanager.ResourceStatus, want []deviceplugin.ResourceStatus) bool {
	for _, st := range want {
		ok := false
		for _, r := range have {
			if r.Name == st.Name {
				ok = st.Registered && r.Connected && r.Capacity == int64(st.Healthy+st.Unhealthy)
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// Example pods in a dpkit checkout.
const (
	examplePodFile        = "examples/pod.yaml"
	exampleTooManyPodFile = "examples/pod-too-many.yaml"
)

// examples are the pod manifests the banner suggests admitting.
type examples struct {
	// Pod is admitted; empty when no resource has an allocatable device.
	Pod string
	// TooMany asks for more devices than there are; may be empty.
	TooMany string
}

// examplePods returns the example pods to suggest, given the resources the
// device manager lists once the plugins are served. The example pod of
// the docs (examples/pod.yaml) is suggested when every resource it asks
// for is served with enough devices: from the checkout when the working
// directory is one (with examples/pod-too-many.yaml), or written below
// root. Otherwise (another --config) the example pods are built from the
// resources served and written below root, so that what is suggested
// gets devices.
func examplePods(root, workDir string, resources []devicemanager.ResourceStatus) (examples, error) {
	dir := filepath.Join(root, "dpkit")
	if fits(examplePod, resources) {
		if _, err := os.Stat(filepath.Join(workDir, examplePodFile)); err == nil {
			return examples{Pod: examplePodFile, TooMany: exampleTooManyPodFile}, nil
		}
		p := filepath.Join(dir, "pod.yaml")
		return examples{Pod: p}, writeExample(p, examplePod)
	}
	var served []devicemanager.ResourceStatus
	for _, r := range resources {
		if r.Allocatable > 0 {
			served = append(served, r)
		}
	}
	if len(served) == 0 {
		return examples{}, nil
	}
	var ex examples
	var pod strings.Builder
	pod.WriteString("# A pod for \"dpkit admit\" that asks for one device of each resource\n# \"dpkit up\" serves.\n")
	pod.WriteString("apiVersion: v1\nkind: Pod\nmetadata:\n  name: demo\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n")
	for _, r := range served {
		fmt.Fprintf(&pod, "        %s: 1\n", r.Name)
	}
	ex.Pod = filepath.Join(dir, "pod.yaml")
	if err := writeExample(ex.Pod, []byte(pod.String())); err != nil {
		return examples{}, err
	}
	r := served[0]
	tooMany := fmt.Sprintf("# A pod that asks for more %s devices than \"dpkit up\" serves (%d):\n# the kubelet rejects it and \"dpkit admit\" exits with status 1.\n"+
		"apiVersion: v1\nkind: Pod\nmetadata:\n  name: too-many\nspec:\n  containers:\n  - name: main\n    resources:\n      limits:\n        %s: %d\n",
		r.Name, r.Allocatable, r.Name, r.Allocatable+1)
	ex.TooMany = filepath.Join(dir, "pod-too-many.yaml")
	return ex, writeExample(ex.TooMany, []byte(tooMany))
}

// fits reports whether every extended resource the pod in manifest asks
// for is served with at least as many allocatable devices as its
// containers ask for in all.
func fits(manifest []byte, resources []devicemanager.ResourceStatus) bool {
	pod, err := emulator.DecodePod(manifest)
	if err != nil {
		return false
	}
	want := map[string]int64{}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		for name, q := range c.Resources.Limits {
			if strings.Contains(string(name), "/") {
				want[string(name)] += q.Value()
			}
		}
	}
	for name, n := range want {
		i := slices.IndexFunc(resources, func(r devicemanager.ResourceStatus) bool { return r.Name == name })
		if i < 0 || resources[i].Allocatable < n {
			return false
		}
	}
	return true
}

func writeExample(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := os.WriteFile(path, data, 0o640); err != nil {
		return fmt.Errorf("writing the example pod: %w", err)
	}
	return nil
}

// printer writes the banner and keeps the first write error.
type printer struct {
	w   io.Writer
	err error
}

func (p *printer) printf(format string, args ...any) {
	if p.err == nil {
		_, p.err = fmt.Fprintf(p.w, format, args...)
	}
}

func (p *printer) printReady(root, self string, s pluginrun.Served, resources []devicemanager.ResourceStatus, ex examples, node, kubeconfig string) {
	srv := s.Server
	how := "Register on kubelet.sock"
	registry := srv != nil && srv.Mode() == deviceplugin.RegistrationRegistry
	if registry {
		how = "a socket in plugins_registry"
	}
	var counts []string
	var status []deviceplugin.ResourceStatus
	if srv != nil {
		status = srv.Status()
	}
	for _, st := range status {
		var n int64
		for _, r := range resources {
			if r.Name == st.Name {
				n = r.Allocatable
			}
		}
		p.printf("plugin %s: %d devices (%d healthy), registered through %s, serving %s\n",
			st.Name, st.Healthy+st.Unhealthy, st.Healthy, how, st.Socket)
		counts = append(counts, fmt.Sprintf("%s=%d", st.Name, n))
	}
	for _, d := range s.DRADrivers {
		p.printf("DRA driver %s: registered through plugins_registry, publishing the ResourceSlices of node %s\n", d, node)
	}
	switch {
	case len(counts) > 0 && len(s.DRADrivers) > 0:
		p.printf("\n%s %s allocatable; DRA drivers %s registered\n\n", readyPrefix, strings.Join(counts, " "), strings.Join(s.DRADrivers, ", "))
	case len(s.DRADrivers) > 0:
		p.printf("\n%s DRA drivers %s registered\n\n", readyPrefix, strings.Join(s.DRADrivers, ", "))
	default:
		p.printf("\n%s %s allocatable\n\n", readyPrefix, strings.Join(counts, " "))
	}
	r := quote(root)
	p.printf("Try, in another terminal:\n")
	p.printf("  %s get resources --root %s\n", self, r)
	if len(s.DRADrivers) > 0 {
		p.printf("  %s get slices --kubeconfig %s\n", self, quote(kubeconfig))
	}
	if registry || len(s.DRADrivers) > 0 {
		// The watcher lists what it found in plugins_registry; plugins
		// that called Register on kubelet.sock are not listed there.
		p.printf("  %s get plugins --root %s\n", self, r)
	}
	switch {
	case ex.Pod == "" && len(s.DRADrivers) == 0:
		p.printf("  (no resource has an allocatable device: nothing to admit a pod for)\n")
	case ex.Pod != "":
		p.printf("  %s admit --root %s -f %s\n", self, r, quote(ex.Pod))
	}
	p.printf("  %s get pods --root %s\n", self, r)
	p.printf("  %s get devices --root %s\n", self, r)
	if ex.TooMany != "" {
		p.printf("  %s admit --root %s -f %s\n", self, r, quote(ex.TooMany))
	}
	if ex.Pod != "" {
		p.printf("  %s delete pod demo --root %s\n", self, r)
	}
	p.printf("The PodResources API answers on %s, as a kubelet's does.\n", podresources.SocketPath(root))
	p.printf("Stop with Ctrl-C.\n")
}

// quote quotes s for a POSIX shell when it needs it.
func quote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=:,+@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// selfCommand is how the printed commands invoke this binary: "dpkit"
// when that is what PATH finds, "go run ./cmd/dpkit" under "go run", and
// the executable's path otherwise.
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "dpkit"
	}
	onPath, _ := exec.LookPath("dpkit")
	return commandFor(exe, onPath)
}

func commandFor(exe, onPath string) string {
	resolve := func(p string) string {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return r
		}
		return p
	}
	switch {
	case onPath != "" && resolve(onPath) == resolve(exe):
		return "dpkit"
	case strings.Contains(filepath.ToSlash(exe), "/go-build") && filepath.Base(exe) == "dpkit":
		return "go run ./cmd/dpkit"
	}
	return quote(exe)
}

// minLevel drops records below a level.
type minLevel struct {
	slog.Handler
	min slog.Level
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(as []slog.Attr) slog.Handler {
	return minLevel{h.Handler.WithAttrs(as), h.min}
}
func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.Handler.WithGroup(name), h.min}
}

// claimsFrom reads claims through the API server of kubeconfig, and
// allocates them, with the API clients of dpkit-cluster (dpkit hands a
// command line with --kubeconfig over to it).
func claimsFrom(env *cli.Env, kubeconfig string) (dramanager.ClaimGetter, emulator.ClaimAllocator, error) {
	if env.Cluster == nil {
		return nil, nil, errors.New("--kubeconfig needs the API server clients of dpkit-cluster")
	}
	r, err := env.Cluster.DRA(kubeconfig)
	if err != nil {
		return nil, nil, cli.Exit(2, fmt.Errorf("--kubeconfig: %w", err))
	}
	return emulator.ClaimsFromJSON(r.ClaimJSON), emulator.AllocatorFromJSON(r.Allocate, r.Release), nil
}

// frontsField names the fronts field of the first plugin with a DRA front.
func frontsField(cfg *config.PluginConfig) string {
	for i := range cfg.Plugins {
		if slices.Contains(cfg.Plugins[i].Fronts, config.FrontDRA) {
			return fmt.Sprintf("plugins[%d].fronts", i)
		}
	}
	return "fronts"
}

// draEnv is the environment the plugins' DRA fronts read: the emulated
// kubelet's node name for $NODE_NAME, and the CDI specs under the root
// (root/cdi) unless $DPKIT_CDI_DIR says where: the runtime's /var/run/cdi
// is the host's, and no container runtime reads them here. The plugins
// and PodResources directories are found beside the root's device-plugins
// directory.
func draEnv(getenv func(string) string, root, node string) func(string) string {
	return func(name string) string {
		switch name {
		case config.EnvNodeName:
			return node
		case config.EnvCDIDir:
			if v := getenv(name); v != "" {
				return v
			}
			return filepath.Join(root, "cdi")
		}
		return getenv(name)
	}
}
