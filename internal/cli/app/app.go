// Package app assembles the dpkit command tree.
package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
)

// ExitCode returns the process exit code for an error returned by Run.
func ExitCode(err error) int { return cli.ExitCode(err) }

// Run executes the dpkit command line args. It is the whole program but for
// signal handling and os.Exit, which stay in main. Without options the
// cluster commands run dpkit-cluster (cluster.go).
func Run(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer, opts ...Option) error {
	env := &cli.Env{In: in, Out: out, Err: errOut, Logger: slog.New(slog.DiscardHandler)}
	root, d := newRoot(env, opts)
	d.args = args
	root.SetArgs(args)
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	return root.ExecuteContext(ctx)
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
	for _, cmd := range commands(env, d, o.commands) {
		root.AddCommand(cmd)
	}
	if env.Cluster == nil {
		for _, cmd := range root.Commands() {
			if flag, ok := clusterFlags[cmd.Name()]; ok {
				d.handOver(cmd, flag)
			}
		}
	}
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
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("--log-format: %q is not a format; use text or json", format)
	}
}
