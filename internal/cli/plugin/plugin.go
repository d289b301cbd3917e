// Package plugin implements "dpkit plugin": it runs the device plugins a
// config file describes.
package plugin

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/probes"
	"github.com/dpkit/dpkit/pkg/deviceplugin"
)

// Flags are the options of "dpkit plugin"; set ones override the file.
type Flags struct {
	Config         string
	PluginDir      string
	Registration   string
	RegistryDir    string
	MetricsAddress string
	SysfsRoot      string
	DevRoot        string
	ProcRoot       string
}

// NewCommand returns the "plugin" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var f Flags
	cmd := &cobra.Command{
		Use:   "plugin --config FILE",
		Short: "Run the device plugins a config file describes",
		Long: `Run the device plugins described by a PluginConfig file and register them
with the kubelet. The process re-registers whenever the kubelet restarts and
removes its sockets when it stops (SIGINT/SIGTERM).`,
		Example: `  dpkit plugin --config examples/fake.yaml
  dpkit plugin --config examples/fake.yaml --plugin-dir /tmp/dp --registration kubelet
  dpkit plugin --config gpu.yaml --metrics-address :9400`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := Load(cmd, f)
			if err != nil {
				return cli.Exit(2, err)
			}
			return Run(cmd.Context(), env, cfg, nil)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&f.Config, "config", "c", "", "PluginConfig file (required), e.g. examples/fake.yaml")
	fl.StringVar(&f.PluginDir, "plugin-dir", "", "kubelet device plugin directory (default /var/lib/kubelet/device-plugins)")
	fl.StringVar(&f.Registration, "registration", "", "registration path: auto, kubelet or registry (default auto: registry when its directory exists)")
	fl.StringVar(&f.RegistryDir, "registry-dir", "", "kubelet plugin watcher directory (default /var/lib/kubelet/plugins_registry)")
	fl.StringVar(&f.MetricsAddress, "metrics-address", "", "serve /metrics, /healthz and /readyz on this address, e.g. :9400 (default off)")
	fl.StringVar(&f.SysfsRoot, "sysfs-root", "", "where the host's /sys is mounted (default /sys)")
	fl.StringVar(&f.DevRoot, "dev-root", "", "where the host's /dev is mounted (default /dev)")
	fl.StringVar(&f.ProcRoot, "proc-root", "", "where the host's /proc is mounted (default /proc)")
	return cmd
}

// Load reads the config file and applies the flags that were set.
func Load(cmd *cobra.Command, f Flags) (*config.PluginConfig, error) {
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
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("--config %s with flags: %w", f.Config, err)
	}
	return cfg, nil
}

// Started is told the server and the probe address (empty when off) once
// both are set up, before registration.
type Started func(srv *deviceplugin.Server, metricsAddr string)

// Run serves cfg's plugins until ctx ends. started may be nil.
func Run(ctx context.Context, env *cli.Env, cfg *config.PluginConfig, started Started) error {
	opts := cfg.HostOptions()
	opts.Logger = env.Logger
	resources, err := cfg.Resources(opts)
	if err != nil {
		return err
	}
	var reg *prometheus.Registry
	if cfg.MetricsAddress != "" {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	dpCfg := deviceplugin.Config{
		PluginDir:    cfg.PluginDir,
		Registration: deviceplugin.RegistrationMode(cfg.Registration),
		RegistryDir:  cfg.RegistryDir,
		Logger:       env.Logger,
	}
	if reg != nil {
		dpCfg.Registerer = reg
	}
	srv, err := deviceplugin.NewServer(dpCfg, resources...)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	addr := ""
	if reg != nil {
		ps, err := probes.Listen(cfg.MetricsAddress, reg, srv.Ready, env.Logger)
		if err != nil {
			return err
		}
		addr = ps.Addr()
		env.Logger.Info("Serving metrics and probes", "address", addr)
		g.Go(func() error { return ps.Serve(ctx) })
	}
	if started != nil {
		started(srv, addr)
	}
	g.Go(func() error { return srv.Run(ctx) })
	return g.Wait()
}
