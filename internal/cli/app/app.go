// Package app assembles the dpkit command tree.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
)

// ExitCode returns the process exit code for an error returned by Run.
func ExitCode(err error) int { return cli.ExitCode(err) }

// ExitBrokenPipe is the exit code of a run whose output's reader went
// away; main prints no error for it.
const ExitBrokenPipe = cli.ExitBrokenPipe

// Run executes the dpkit command line args. It is the whole program but for
// signal handling and os.Exit (Main). Without options the cluster commands
// run dpkit-cluster (cluster.go).
//
// Its error carries the exit code of dpkit's command contract
// (docs/cli.md): 2 for a usage error, anything cobra rejects before the
// command runs (an unknown command or flag, a bad flag value, a wrong
// number of arguments) included; 130 when ctx ends (Ctrl-C, SIGTERM)
// before a command that does a job finished it; 1 for other failures. A
// command that serves until stopped (ServerAnnotation) returns nil when
// ctx ends and it stopped cleanly. A command run by dpkit-cluster exits as
// dpkit-cluster did.
func Run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer, opts ...Option) error {
	env := &cli.Env{In: in, Out: out, Err: errOut, Logger: slog.New(slog.DiscardHandler)}
	root, d := newRoot(env, opts)
	d.args = args
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	started := false
	hook := root.PersistentPreRunE
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if err := hook(cmd, args); err != nil {
			return cli.UsageError(err)
		}
		started = true
		return nil
	}
	cmd, err := root.ExecuteContextC(ctx)
	if d.ran {
		return err
	}
	return contractError(ctx, cmd, started, err)
}

// contractError gives err the exit code the command contract asks for.
func contractError(ctx context.Context, cmd *cobra.Command, started bool, err error) error {
	stoppedServer := ctx.Err() != nil && cmd != nil && isServer(cmd)
	if errors.Is(err, syscall.EPIPE) && cli.ExitCode(err) == 1 && !stoppedServer {
		// The reader of the output went away (dpkit get pods | head):
		// exit as a process killed by SIGPIPE would, without a message.
		return cli.Exit(cli.ExitBrokenPipe, err)
	}
	if err != nil && !started && cli.ExitCode(err) == 1 {
		// Cobra rejected the command line before the command ran.
		where := "dpkit"
		if cmd != nil {
			where = cmd.CommandPath()
		}
		return cli.UsageError(cli.WithHelp(err, where))
	}
	if cli.ExitCode(err) == cli.ExitUsage && !cli.HasHelp(err) && cmd != nil {
		// Every usage error ends by saying where to read the usage.
		return cli.UsageError(cli.WithHelp(err, cmd.CommandPath()))
	}
	if ctx.Err() == nil || !started || cli.ExitCode(err) == cli.ExitUsage {
		return err
	}
	if stoppedServer {
		// Stopped by a signal, a server's farewell to a reader that went
		// away (dpkit up | head) is no failure.
		if errors.Is(err, context.Canceled) || errors.Is(err, syscall.EPIPE) {
			return nil
		}
		return err
	}
	if cli.ExitCode(err) == cli.ExitInterrupted {
		return err
	}
	if err == nil || errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	return cli.Exit(cli.ExitInterrupted, err)
}

// servers are the commands that serve until they are stopped: "true", or
// the flag that makes them serve.
var servers = map[string]string{
	"plugin":    "true",
	"kubelet":   "true",
	"up":        "true",
	"node":      "true",
	"advertise": "--watch",
	"exporter":  "true",
}

// isServer reports whether cmd, as invoked, serves until stopped.
func isServer(cmd *cobra.Command) bool {
	switch v := cmd.Annotations[cli.ServerAnnotation]; {
	case v == "true":
		return true
	case strings.HasPrefix(v, "--"):
		f := cmd.Flags().Lookup(strings.TrimPrefix(v, "--"))
		return f != nil && f.Value.String() == "true"
	}
	return false
}

// NewRootCommand returns the dpkit root command with every subcommand.
func NewRootCommand(env *cli.Env, opts ...Option) *cobra.Command {
	root, _ := newRoot(env, opts)
	return root
}

func newRoot(env *cli.Env, opts []Option) (*cobra.Command, *dispatcher) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	env.Cluster = o.cluster
	d := &dispatcher{env: env, lookPath: o.lookPath}
	if d.lookPath == nil {
		d.lookPath = findClusterBinary
	}
	var logLevel, logFormat string
	root := &cobra.Command{
		Use:   "dpkit",
		Short: "Device plugins, an emulated kubelet device manager and virtual nodes for Kubernetes",
		Long: `dpkit lets Kubernetes nodes offer devices and custom resources to pods.

It runs device plugins (dpkit plugin), an emulated kubelet device manager to
run and test any plugin without a cluster (dpkit up, dpkit kubelet), a
conformance checker for plugins (dpkit verify), an extended-resource
advertiser (dpkit advertise) and virtual nodes (dpkit node).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(env.Err, logLevel, logFormat)
			if err != nil {
				return err
			}
			env.Logger = logger
			return nil
		},
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text", "log format: text or json")
	root.SetFlagErrorFunc(cli.FlagError)
	for _, cmd := range commands(env, d, o.commands) {
		if v, ok := servers[cmd.Name()]; ok {
			if cmd.Annotations == nil {
				cmd.Annotations = map[string]string{}
			}
			cmd.Annotations[cli.ServerAnnotation] = v
		}
		root.AddCommand(cmd)
	}
	if env.Cluster == nil {
		env.HandOver = func(cmd *cobra.Command) error { return d.run(cmd, d.args) }
		for _, cmd := range root.Commands() {
			if flag, ok := clusterFlags[cmd.Name()]; ok {
				d.handOver(cmd, flag)
			}
		}
	}
	// "dpkit completion bash|zsh|fish|powershell", added now rather than
	// when the command runs, so that it is part of the tree from the start.
	root.InitDefaultCompletionCmd()
	return root, d
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %q is not a level; use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(&componentHandler{next: slog.NewTextHandler(w, opts)}), nil
	case "json":
		return slog.New(&componentHandler{next: slog.NewJSONHandler(w, opts)}), nil
	default:
		return nil, fmt.Errorf("--log-format: %q is not a format; use text or json", format)
	}
}
