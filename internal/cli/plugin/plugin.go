// Package plugin implements "dpkit plugin": it runs the device plugins a
// config file describes.
package plugin

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/config"
	"github.com/dpkit/dpkit/internal/pluginrun"
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
}

// NewCommand returns the "plugin" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var f flags
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
			cfg, err := load(cmd, f)
			if err != nil {
				return cli.Exit(2, err)
			}
			return pluginrun.Run(cmd.Context(), env.Logger, cfg, nil)
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

// load reads the config file and applies the flags that were set.
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
	if err := cfg.Check(); err != nil {
		return nil, fmt.Errorf("--config %s with flags: %w", f.Config, err)
	}
	return cfg, nil
}
