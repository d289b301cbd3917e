// Package verify implements "dpkit verify": a conformance checker for any
// device plugin (package pkg/verify).
package verify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/pkg/verify"
)

// NewCommand returns the "verify" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var (
		cfg    verify.Config
		output string
		junit  string
	)
	cmd := &cobra.Command{
		Use:   "verify [flags] -- COMMAND [ARGS...]",
		Short: "Check that a device plugin behaves the way the kubelet needs",
		Long: `Start a device plugin against an emulated kubelet and check, one by one, what
the kubelet relies on: registration, ListAndWatch, Allocate, preferred
allocation, PreStartContainer, re-registration after kubelet restarts, message
sizes, the plugin watcher path and SIGTERM. Every check has an ID, a verdict
(pass, fail, warn, skip) and a detail; docs/verify.md explains each one and
how to fix a failure. The exit code is 1 when any check fails, 2 for usage
errors, and 130 when verify is interrupted (Ctrl-C, SIGTERM): the plugin is
stopped and the checks not finished are reported as skipped.

In ARGS, {plugin-dir} is replaced with the emulated device plugin directory
(also in $DPKIT_PLUGIN_DIR and $PLUGIN_SOCK_DIR) and {registry-dir} with the
plugins_registry directory (--plugin-watcher; also $DPKIT_REGISTRY_DIR).`,
		Example: `  dpkit verify -- dpkit plugin --config examples/fake.yaml --plugin-dir {plugin-dir}
  dpkit verify --private-mount -- ./my-plugin            # plugin knows only /var/lib/kubelet/device-plugins
  dpkit verify --plugin-watcher -- dpkit plugin -c examples/fake.yaml --plugin-dir {plugin-dir} --registration registry --registry-dir {registry-dir}
  dpkit verify --socket-dir /run/dp -o json               # a plugin already running, registering in /run/dp
  dpkit verify --junit verify.xml -- ./my-plugin --dir {plugin-dir}`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return cli.Exit(2, fmt.Errorf("-o: %q is not a format; use table or json", output))
			}
			if cmd.ArgsLenAtDash() < 0 && len(args) > 0 {
				return cli.Exit(2, errors.New("put the plugin command after --, e.g. dpkit verify -- my-plugin --flag"))
			}
			cfg.Command = args
			if cfg.SocketDir != "" {
				abs, err := filepath.Abs(cfg.SocketDir)
				if err != nil {
					return cli.Exit(2, fmt.Errorf("--socket-dir: %w", err))
				}
				cfg.SocketDir = abs
			}
			if cfg.PrivateMount && os.Geteuid() != 0 {
				return cli.Exit(2, verify.ErrNotRoot)
			}
			if err := cfg.Validate(); err != nil {
				return cli.Exit(2, err)
			}
			cfg.Logger = env.Logger
			rep, err := verify.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if junit != "" {
				if err := writeJUnit(junit, rep); err != nil {
					return err
				}
			}
			if output == "json" {
				err = rep.WriteJSON(env.Out)
			} else {
				err = rep.WriteTable(env.Out)
			}
			if err != nil {
				return err
			}
			switch {
			case rep.Interrupted:
				return cli.Exit(cli.ExitInterrupted, errors.New("interrupted"))
			case rep.Failed():
				return cli.Exit(1, fmt.Errorf("%d of %d checks failed", rep.Summary.Failed, len(rep.Results)))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.SocketDir, "socket-dir", "", "verify a plugin that is already running and registers through DIR/kubelet.sock (the checks that stop it are skipped)")
	fl.BoolVar(&cfg.PrivateMount, "private-mount", false, "run the plugin in its own mount namespace where /var/lib/kubelet/device-plugins is the emulated directory (needs root)")
	fl.BoolVar(&cfg.PluginWatcher, "plugin-watcher", false, "register through a plugins_registry directory ({registry-dir}) instead of kubelet.sock")
	fl.StringVarP(&output, "output", "o", "table", "output format: table or json")
	fl.StringVar(&junit, "junit", "", "also write the results as JUnit XML to FILE")
	fl.DurationVar(&cfg.RegisterTimeout, "register-timeout", verify.DefaultRegisterTimeout, "how long to wait for the plugin's first registration")
	fl.DurationVar(&cfg.ReregisterThreshold, "reregister-threshold", verify.DefaultReregisterThreshold, "longest acceptable time to register again after a kubelet restart or socket deletion")
	fl.DurationVar(&cfg.ReregisterWarn, "reregister-warn", verify.DefaultReregisterWarn, "warn when registering again takes longer than this")
	fl.IntVar(&cfg.Restarts, "restarts", verify.DefaultRestarts, "kubelet restarts to emulate in a row")
	fl.DurationVar(&cfg.TermTimeout, "term-timeout", verify.DefaultTermTimeout, "how long the plugin may take to exit after SIGTERM")
	fl.DurationVar(&cfg.QuietPeriod, "quiet-period", verify.DefaultQuietPeriod, "how long to watch for further registrations after one (registration storms)")
	fl.DurationVar(&cfg.HealthWait, "health-wait", 0, "wait up to this long for a device to change health, to check health updates")
	fl.DurationVar(&cfg.CallTimeout, "call-timeout", verify.DefaultCallTimeout, "timeout of each RPC and ListAndWatch wait")
	return cmd
}

func writeJUnit(path string, rep *verify.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	if err := rep.WriteJUnit(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("--junit: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	return nil
}
