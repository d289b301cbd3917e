// Package verify implements "dpkit verify": a conformance checker for any
// device plugin (package pkg/verify).
package verify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/pkg/verify"
)

// NewCommand returns the "verify" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var (
		cfg     verify.Config
		dra     verify.DRAConfig
		draMode bool
		kubecfg string
		cleanup bool
		format  string
		junit   string
	)
	cmd := &cobra.Command{
		Use:   "verify [flags] -- COMMAND [ARGS...]",
		Short: "Check that a device plugin behaves the way the kubelet needs",
		Long: `Start a device plugin against an emulated kubelet and check, one by one, what
the kubelet relies on: registration, ListAndWatch, Allocate, preferred
allocation, PreStartContainer, re-registration after kubelet restarts, message
sizes, the plugin watcher path and SIGTERM. Every check has an ID, a verdict
(pass, fail, warn, skip) and a detail; a check that fails or warns also says
how to fix it and links to its section of docs/verify.md. On a terminal each
check is printed as soon as it is decided. The exit code is 1 when any check
fails, 2 for usage errors, and 130 when verify is interrupted (Ctrl-C,
SIGTERM): the plugin is stopped and the checks not finished are reported as
skipped.

The plugin is told where the emulated kubelet serves: {plugin-dir} in ARGS is
replaced with the emulated device plugin directory, also in $DPKIT_PLUGIN_DIR
(a plugin written with the dpkit SDK serves there when its Config sets no
PluginDir) and $PLUGIN_SOCK_DIR; {registry-dir} with the plugins_registry
directory (--plugin-watcher; also $DPKIT_REGISTRY_DIR).

With --dra, verify checks a DRA driver instead, against dpkit's DRA manager
and an API server (--kubeconfig): registration, ResourceSlices,
NodePrepareResources and NodeUnprepareResources, CDI specs, kubelet and driver
restarts, health, SIGTERM, and that the driver needs no more of the API server
than its RBAC (dra.rbac). The driver is told $DPKIT_REGISTRY_DIR,
$DPKIT_DRA_PLUGINS_DIR, $DPKIT_CDI_DIR, $NODE_NAME, $KUBECONFIG and $POD_UID
(also {registry-dir}, {plugins-dir}, {cdi-dir}, {node-name}, {kubeconfig}
and {pod-uid} in ARGS; $POD_UID differs per instance, for the rolling-update
check); dpkit plugin's DRA front uses them when its config leaves those
settings at their defaults. The driver never gets verify's kubeconfig: its
$KUBECONFIG holds the token of a ServiceAccount made for the run, bound to the
ClusterRoles and Roles of --rbac FILE (default: those of dpkit's
deploy/components/dra/rbac.yaml), and reaches the API server through a proxy
in verify that records every request the API server forbids it.

Everything a run creates on the API server carries the label
dpkit.io/verify-run=<run> and is deleted by that label at the end; the driver
is killed with verify, even by SIGKILL. What a run that was killed left
(objects, its temporary root in $TMPDIR/dpvd*, processes the driver forked)
is removed by "dpkit verify --dra --cleanup", which leaves runs that go on
alone.`,
		Example: `  dpkit verify --dra --kubeconfig k.conf -- dpkit plugin --config examples/fake-dra.yaml
  dpkit verify --dra --rbac deploy/rbac.yaml -- ./my-driver --kubeconfig {kubeconfig} --node-name {node-name}
  dpkit verify --dra --cleanup                            # remove what killed runs left
  dpkit verify -- ./myplugin                             # a plugin written with the dpkit SDK
  dpkit verify -- dpkit plugin --config examples/fake.yaml --plugin-dir {plugin-dir}
  dpkit verify --private-mount -- ./my-plugin            # plugin knows only /var/lib/kubelet/device-plugins
  dpkit verify --plugin-watcher -- dpkit plugin -c examples/fake.yaml --plugin-dir {plugin-dir} --registration registry --registry-dir {registry-dir}
  dpkit verify --socket-dir /run/dp -o json               # a plugin already running, registering in /run/dp
  dpkit verify --junit verify.xml -- ./my-plugin --dir {plugin-dir}`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() < 0 && len(args) > 0 {
				return cli.Exit(2, errors.New("put the plugin command after --, e.g. dpkit verify -- ./myplugin"))
			}
			if draMode && cleanup {
				return runCleanup(cmd, env, kubecfg, verify.DRACleanupConfig{CallTimeout: cfg.CallTimeout}, format, args)
			}
			if draMode {
				return runDRA(cmd, env, kubecfg, draFlags(cmd, cfg, dra, args), format, junit)
			}
			cfg.Command = args
			for _, f := range draOnly {
				if cmd.Flags().Changed(f) {
					return cli.Exit(2, fmt.Errorf("--%s: applies with --dra only; add --dra to verify a DRA driver", f))
				}
			}
			if err := usageProblems(&cfg, junit); err != nil {
				return cli.Exit(2, err)
			}
			cfg.Logger = env.Logger
			// On a terminal each check prints as it is decided; "wide" does
			// not cut details to the terminal's width.
			live := (format == output.Table || format == output.Wide) && isTerminal(env.Out)
			var lv *liveWriter
			if live {
				lv = newLiveWriter(env.Out, format == output.Wide)
				cfg.Progress = lv.result
				lv.start(cfg)
			}
			rep, err := verify.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			return finish(env, rep, format, junit, live)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.SocketDir, "socket-dir", "", "verify a plugin that is already running and registers through DIR/kubelet.sock (the checks that stop it are skipped)")
	fl.BoolVar(&cfg.PrivateMount, "private-mount", false, "run the plugin in its own mount namespace where /var/lib/kubelet/device-plugins is the emulated directory (needs root)")
	fl.BoolVar(&cfg.PluginWatcher, "plugin-watcher", false, "register through a plugins_registry directory ({registry-dir}) instead of kubelet.sock")
	output.AddFlag(cmd, &format, output.Table, output.Wide, output.JSON, output.YAML)
	fl.StringVar(&junit, "junit", "", "also write the results as JUnit XML to FILE (its directory must exist)")
	fl.DurationVar(&cfg.RegisterTimeout, "register-timeout", verify.DefaultRegisterTimeout, "how long to wait for the plugin's first registration")
	fl.DurationVar(&cfg.ReregisterThreshold, "reregister-threshold", verify.DefaultReregisterThreshold, "longest acceptable time to register again after a kubelet restart or socket deletion")
	fl.DurationVar(&cfg.ReregisterWarn, "reregister-warn", verify.DefaultReregisterWarn, "warn when registering again takes longer than this")
	fl.IntVar(&cfg.Restarts, "restarts", verify.DefaultRestarts, "kubelet restarts to emulate in a row (1 or more)")
	fl.DurationVar(&cfg.TermTimeout, "term-timeout", verify.DefaultTermTimeout, "how long the plugin may take to exit after SIGTERM")
	fl.DurationVar(&cfg.QuietPeriod, "quiet-period", verify.DefaultQuietPeriod, "how long to watch for further registrations after one (registration storms)")
	fl.DurationVar(&cfg.HealthWait, "health-wait", 0, "wait up to this long for a device to change health, to check health updates")
	fl.DurationVar(&cfg.CallTimeout, "call-timeout", verify.DefaultCallTimeout, "timeout of each RPC and ListAndWatch wait")
	fl.BoolVar(&draMode, "dra", false, "verify a DRA driver instead of a device plugin (needs an API server: --kubeconfig)")
	fl.StringVar(&kubecfg, "kubeconfig", "", "with --dra: the API server's kubeconfig (default $KUBECONFIG, ~/.kube/config)")
	fl.DurationVar(&dra.PrepareTimeout, "prepare-timeout", verify.DefaultPrepareTimeout, "with --dra: the longest a NodePrepareResources or NodeUnprepareResources call may take")
	fl.DurationVar(&dra.HealthTimeout, "health-timeout", verify.DefaultDRAHealthTimeout, "with --dra: how long a device health report holds")
	fl.StringVar(&dra.RBAC, "rbac", "", "with --dra: a YAML file of the ClusterRoles and Roles the driver is deployed with, all it is granted (default: dpkit's deploy/components/dra/rbac.yaml)")
	fl.BoolVar(&cleanup, "cleanup", false, "with --dra: run no driver; remove what runs killed before their clean-up left (objects labelled dpkit.io/verify-run, $TMPDIR/dpvd* roots, driver processes)")
	return cmd
}

// flagOf names the flag behind each field of verify.Config's problems.
var flagOf = map[string]string{
	"command": "COMMAND", "socketDir": "--socket-dir", "privateMount": "--private-mount", "pluginWatcher": "--plugin-watcher",
	"registerTimeout": "--register-timeout", "reregisterThreshold": "--reregister-threshold", "reregisterWarn": "--reregister-warn",
	"termTimeout": "--term-timeout", "quietPeriod": "--quiet-period", "healthWait": "--health-wait", "callTimeout": "--call-timeout",
	"restarts": "--restarts",
}

// detailOf words the problems of verify.Config that name its fields
// (keys: the library's detail) in the command line's terms.
var detailOf = map[string]string{
	"give the plugin command, or SocketDir of a running plugin":               "give the plugin command (dpkit verify -- my-plugin ...) or the directory of a running plugin (--socket-dir)",
	"give either a command to run or SocketDir of a running plugin, not both": "give either a command to run or --socket-dir of a running plugin, not both",
}

// usageProblems checks everything about the command line that can be
// checked before the run, and reports every problem at once, each with the
// flag it is about and the fix. It makes --socket-dir absolute.
func usageProblems(cfg *verify.Config, junit string) error {
	var problems []string
	seen := map[string]bool{}
	add := func(flag, msg string) {
		seen[flag] = true
		problems = append(problems, flag+": "+msg)
	}
	// Zero would mean verify's default, not what was asked for.
	for _, d := range []struct {
		flag     string
		v, byDef time.Duration
	}{
		{"--register-timeout", cfg.RegisterTimeout, verify.DefaultRegisterTimeout},
		{"--reregister-threshold", cfg.ReregisterThreshold, verify.DefaultReregisterThreshold},
		{"--reregister-warn", cfg.ReregisterWarn, verify.DefaultReregisterWarn},
		{"--term-timeout", cfg.TermTimeout, verify.DefaultTermTimeout},
		{"--quiet-period", cfg.QuietPeriod, verify.DefaultQuietPeriod},
		{"--call-timeout", cfg.CallTimeout, verify.DefaultCallTimeout},
	} {
		if d.v <= 0 {
			add(d.flag, fmt.Sprintf("%s: must be above 0 (default %s)", d.v, d.byDef))
		}
	}
	if cfg.HealthWait < 0 {
		add("--health-wait", fmt.Sprintf("%s: must not be negative; 0 observes only what happens during the other checks", cfg.HealthWait))
	}
	if cfg.Restarts < 1 {
		add("--restarts", fmt.Sprintf("%d: give 1 or more (default %d); the restart checks need at least one kubelet restart", cfg.Restarts, verify.DefaultRestarts))
	}
	if junit != "" {
		if msg := junitProblem(junit); msg != "" {
			add("--junit", msg)
		}
	}
	if cfg.SocketDir != "" {
		if abs, err := filepath.Abs(cfg.SocketDir); err == nil {
			cfg.SocketDir = abs
		}
	}
	if cfg.PrivateMount && os.Geteuid() != 0 {
		add("--private-mount", strings.TrimPrefix(verify.ErrNotRoot.Error(), "--private-mount "))
	}
	for _, e := range cfg.Problems() {
		flag := flagOf[e.Field]
		if flag == "" {
			flag = e.Field
		}
		if seen[flag] {
			continue
		}
		if d, ok := detailOf[e.Detail]; ok {
			e.Detail = d
		}
		if e.Type == field.ErrorTypeRequired {
			add(flag, e.Detail+"")
			continue
		}
		add(flag, e.ErrorBody())
	}
	switch len(problems) {
	case 0:
		return nil
	case 1:
		return errors.New(problems[0])
	}
	return fmt.Errorf("%d problem(s):\n  - %s", len(problems), strings.Join(problems, "\n  - "))
}

// junitProblem says what is wrong with the JUnit file path, or "".
func junitProblem(path string) string {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Sprintf("%s is a directory; give a file path, e.g. %s", path, filepath.Join(path, "verify.xml"))
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("directory %s does not exist; create it first (mkdir -p %s) or give a path in an existing directory", dir, dir)
	case err != nil:
		return err.Error()
	case !fi.IsDir():
		return fmt.Sprintf("%s is not a directory; give a path in an existing directory", dir)
	}
	return ""
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
