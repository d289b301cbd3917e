// Package plugin implements "dpkit plugin": it runs the device plugins a
// config file describes, or with --validate checks the file and the node
// without serving.
package plugin

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/pluginrun"
	"github.com/dpkit/dpkit/pkg/configfile"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// flags are the options of "dpkit plugin"; set ones override the file.
type flags struct {
	Config         string
	PluginDir      string
	Registration   string
	RegistryDir    string
	MetricsAddress string
	SysfsRoot      string
	DevRoot        string
	ProcRoot       string
	Validate       bool
	Output         string
}

// overrides maps the field path of each config field a flag sets to the
// flag, so a problem with a value a flag gave is named by the flag.
var overrides = []struct{ flag, path string }{
	{"plugin-dir", "pluginDir"},
	{"registration", "registration"},
	{"registry-dir", "registryDir"},
	{"metrics-address", "metricsAddress"},
	{"sysfs-root", "host.sysfsRoot"},
	{"dev-root", "host.devRoot"},
	{"proc-root", "host.procRoot"},
}

// NewCommand returns the "plugin" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "plugin --config FILE",
		Short: "Run the device plugins a config file describes",
		Long: `Run the device plugins described by a PluginConfig file and register them
with the kubelet. The process re-registers whenever the kubelet restarts and
removes its sockets when it stops (SIGINT/SIGTERM).

With --validate nothing is served: the file and the flags are checked, the
plugins built, and the directories the kubelet uses looked for. The exit
status is 0 when all is well, 2 when the config is wrong (every problem
listed with its field path) and 1 when the config is valid but this machine
is not ready for it (a directory missing).`,
		Example: `  dpkit plugin --config examples/fake.yaml
  dpkit plugin --config examples/fake.yaml --validate
  dpkit plugin --config examples/fake.yaml --plugin-dir /tmp/dp --registration kubelet
  dpkit plugin --config gpu.yaml --metrics-address :9400`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var usage field.ErrorList
			if cmd.Flags().Changed("output") && !f.Validate {
				usage = append(usage, field.Forbidden(field.NewPath("--output"), "applies only to --validate; dpkit plugin prints nothing else"))
			}
			if len(usage) > 0 {
				return cli.Exit(2, configfile.Problems(usage))
			}
			cfg, err := load(cmd, f)
			if err != nil {
				return cli.Exit(2, err)
			}
			if f.Validate {
				return validate(cmd, env, cfg, f.Output)
			}
			if env.Cluster == nil && cfg.UsesFront(config.FrontDRA) && env.HandOver != nil {
				// The DRA front needs the Kubernetes client libraries.
				return env.HandOver(cmd)
			}
			return pluginrun.RunWith(cmd.Context(), env.Logger, cfg, nil, runOptions(env))
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.Config, "config", "c", "", "PluginConfig file (required), e.g. examples/fake.yaml")
	fl.StringVar(&f.PluginDir, "plugin-dir", "", "kubelet device plugin directory (default $"+deviceplugin.EnvPluginDir+", else "+filepath.Clean(pluginapi.DevicePluginPath)+")")
	fl.StringVar(&f.Registration, "registration", "", "registration path: auto, kubelet or registry (default auto: registry when its directory exists)")
	fl.StringVar(&f.RegistryDir, "registry-dir", "", "kubelet plugin watcher directory (default: plugins_registry beside --plugin-dir, "+deviceplugin.DefaultRegistryDir+" for the default --plugin-dir)")
	fl.StringVar(&f.MetricsAddress, "metrics-address", "", "serve /metrics, /healthz and /readyz on this address, e.g. :9400 (default off)")
	fl.StringVar(&f.SysfsRoot, "sysfs-root", "", "where the host's /sys is mounted (default /sys)")
	fl.StringVar(&f.DevRoot, "dev-root", "", "where the host's /dev is mounted (default /dev)")
	fl.StringVar(&f.ProcRoot, "proc-root", "", "where the host's /proc is mounted (default /proc)")
	fl.BoolVar(&f.Validate, "validate", false, "check the config, the flags and the directories, print what would be served, and exit without serving")
	output.AddFlag(cmd, &f.Output)
	fl.Lookup("output").Usage = "with --validate: output format, table, json or yaml"
	return cmd
}

// load reads the config file and applies the flags that were set. A
// problem with a value a flag set is named by the flag.
func load(cmd *cobra.Command, f flags) (*config.PluginConfig, error) {
	cfg, err := config.LoadPluginConfig(f.Config, "--config")
	if err != nil {
		return nil, err
	}
	set := func(name string, dst *string, v string) {
		if cmd.Flags().Changed(name) {
			*dst = v
		}
	}
	set("plugin-dir", &cfg.PluginDir, f.PluginDir)
	set("registration", &cfg.Registration, f.Registration)
	set("registry-dir", &cfg.RegistryDir, f.RegistryDir)
	set("metrics-address", &cfg.MetricsAddress, f.MetricsAddress)
	set("sysfs-root", &cfg.Host.SysfsRoot, f.SysfsRoot)
	set("dev-root", &cfg.Host.DevRoot, f.DevRoot)
	set("proc-root", &cfg.Host.ProcRoot, f.ProcRoot)
	err = cfg.Check()
	var problems configfile.Problems
	if !errors.As(err, &problems) {
		return cfg, err
	}
	return nil, fmt.Errorf("--config %s with flags:\n%w", f.Config, configfile.Problems(nameFlags(cmd, field.ErrorList(problems))))
}

// nameFlags renames each problem with a value a flag set after the flag.
func nameFlags(cmd *cobra.Command, errs field.ErrorList) field.ErrorList {
	out := make(field.ErrorList, len(errs))
	for i, e := range errs {
		out[i] = e
		for _, o := range overrides {
			if e.Field == o.path && cmd.Flags().Changed(o.flag) {
				named := *e
				named.Field = "--" + o.flag
				out[i] = &named
			}
		}
	}
	return out
}

// report is what --validate prints: what would be served, and where it
// would register.
type report struct {
	Plugins []pluginReport `json:"plugins"`
	// PluginDir is the kubelet's device plugin directory.
	PluginDir string `json:"pluginDir"`
	// Registration is the registration path taken, kubelet or registry
	// (auto resolved as it would be now).
	Registration string `json:"registration"`
	// RegistryDir is the plugin watcher directory.
	RegistryDir string `json:"registryDir"`
	// Resources are every resource with its fronts and DRA names.
	Resources []config.ResourceFront `json:"resources"`
	// DRA is the dra section, when a resource has the dra front.
	DRA *config.DRAConfig `json:"dra,omitempty"`
}

type pluginReport struct {
	Kind      string   `json:"kind"`
	Resources []string `json:"resources"`
}

// validate builds the plugins of cfg, checks the directories they need and
// prints the report; it serves nothing.
func validate(cmd *cobra.Command, env *cli.Env, cfg *config.PluginConfig, format string) error {
	built, err := cfg.Build(cfg.HostOptions())
	if err != nil {
		return cli.Exit(2, err)
	}
	// The directories the plugin would use: the flags' and the file's,
	// else the environment's ($DPKIT_PLUGIN_DIR and $DPKIT_REGISTRY_DIR, read
	// by the SDK; $DPKIT_DRA_PLUGINS_DIR, $DPKIT_CDI_DIR and $NODE_NAME, read
	// by pluginrun), else the kubelet's.
	pluginDir, registryDir := deviceplugin.Config{PluginDir: cfg.PluginDir, RegistryDir: cfg.RegistryDir}.Dirs()
	r := report{Plugins: []pluginReport{}, PluginDir: filepath.Clean(pluginDir), RegistryDir: filepath.Clean(registryDir), Resources: cfg.Fronts()}
	if cfg.UsesFront(config.FrontDRA) {
		d := cfg.DRA.Resolve(env.Var, pluginDir)
		if node, err := d.Node(env.Var); err == nil {
			d.NodeName = node
		}
		r.DRA = &d
	}
	hostDevices := false
	for _, b := range built {
		pr := pluginReport{Kind: b.Kind, Resources: []string{}}
		for _, res := range b.Resources {
			pr.Resources = append(pr.Resources, res.Name)
		}
		r.Plugins = append(r.Plugins, pr)
		hostDevices = hostDevices || b.Kind != "fake"
	}

	var errs field.ErrorList
	dir := func(path, value, fix string) bool {
		fi, err := os.Stat(value)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(field.NewPath(path), value, "no such directory on this machine; "+fix))
		case !fi.IsDir():
			errs = append(errs, field.Invalid(field.NewPath(path), value, "not a directory; "+fix))
		default:
			return true
		}
		return false
	}
	dir("pluginDir", r.PluginDir, "is the kubelet installed here? Point --plugin-dir at its device-plugins directory")
	switch deviceplugin.RegistrationMode(cfg.Registration) {
	case deviceplugin.RegistrationRegistry:
		r.Registration = string(deviceplugin.RegistrationRegistry)
		dir("registryDir", r.RegistryDir, "point --registry-dir at the kubelet's plugins_registry directory, or use --registration kubelet")
	case deviceplugin.RegistrationKubelet:
		r.Registration = string(deviceplugin.RegistrationKubelet)
	default:
		r.Registration = string(deviceplugin.RegistrationKubelet)
		if fi, err := os.Stat(r.RegistryDir); err == nil && fi.IsDir() {
			r.Registration = string(deviceplugin.RegistrationRegistry)
		}
	}
	if hostDevices {
		opts := cfg.HostOptions().Defaults()
		dir("host.sysfsRoot", opts.SysfsRoot, "point --sysfs-root at the host's /sys")
		dir("host.devRoot", opts.DevRoot, "point --dev-root at the host's /dev")
		dir("host.procRoot", opts.ProcRoot, "point --proc-root at the host's /proc")
	}
	if len(errs) > 0 {
		return cli.Exit(1, fmt.Errorf("the config is valid, but this machine is not ready for it:\n%w", configfile.Problems(nameFlags(cmd, errs))))
	}
	if env.Cluster == nil && cfg.UsesFront(config.FrontDRA) && env.HandOver != nil {
		if _, err := fmt.Fprintln(env.Err, "Note: the dra front needs the Kubernetes client libraries: dpkit plugin hands this config over to dpkit-cluster"); err != nil {
			return err
		}
	} else if err := pluginrun.CheckFronts(cfg, runOptions(env)); err != nil {
		if _, err := fmt.Fprintln(env.Err, "Warning: dpkit plugin will not serve this config:", err); err != nil {
			return err
		}
	}
	return output.Write(env.Out, format, r, r.table)
}

// table writes the report as two lines:
//
//	config OK: 1 plugin: fake (example.com/foo)
//	registration: kubelet, through /var/lib/kubelet/device-plugins/kubelet.sock
func (r report) table(w *tabwriter.Writer) error {
	parts := make([]string, len(r.Plugins))
	for i, p := range r.Plugins {
		parts[i] = fmt.Sprintf("%s (%s)", p.Kind, strings.Join(p.Resources, ", "))
	}
	noun := "plugins"
	if len(r.Plugins) == 1 {
		noun = "plugin"
	}
	if _, err := fmt.Fprintf(w, "config OK: %d %s: %s\n", len(r.Plugins), noun, strings.Join(parts, ", ")); err != nil {
		return err
	}
	for _, rf := range r.Resources {
		line := fmt.Sprintf("  %s: %s", rf.Resource, strings.Join(rf.Fronts, ", "))
		if rf.Has(config.FrontDRA) {
			line += fmt.Sprintf(" (driver %s, DeviceClass %s)", rf.DriverName, rf.DeviceClass)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	if d := r.DRA; d != nil {
		node := cmp.Or(d.NodeName, "$"+config.EnvNodeName+" (not set here)")
		if _, err := fmt.Fprintf(w, "dra: node %s, plugins in %s, CDI specs in %s\n", node, d.PluginsDir, d.CDIDir); err != nil {
			return err
		}
	}
	where := "through " + filepath.Join(r.PluginDir, filepath.Base(pluginapi.KubeletSocket))
	if r.Registration == string(deviceplugin.RegistrationRegistry) {
		where = "in " + r.RegistryDir
	}
	_, err := fmt.Fprintf(w, "registration: %s, %s\n", r.Registration, where)
	return err
}

// runOptions are the options of pluginrun.RunWith in this binary: the DRA
// front where the binary has the client libraries.
func runOptions(env *cli.Env) pluginrun.Options {
	o := pluginrun.Options{Getenv: env.Var}
	if env.Cluster != nil {
		o.DRA = env.Cluster.DRAFront()
	}
	return o
}
