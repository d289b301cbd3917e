package verify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/pkg/verify"
)

// draVerifier runs dpkit verify --dra and --dra --cleanup against the
// API server of kubeconfig (the value of --kubeconfig; empty: $KUBECONFIG,
// ~/.kube/config, in-cluster); dpkit-cluster's Env.Cluster has it
// (pkg/verify/draverify needs client-go), dpkit hands --dra over.
type draVerifier interface {
	VerifyDRA(ctx context.Context, kubeconfig string, cfg verify.DRAConfig) (*verify.Report, error)
	CleanupDRA(ctx context.Context, kubeconfig string, cfg verify.DRACleanupConfig) (*verify.DRACleanupReport, error)
}

// deviceOnly are the flags that apply to device plugins only.
var deviceOnly = []string{"socket-dir", "private-mount", "plugin-watcher", "restarts", "quiet-period", "health-wait"}

// draOnly are the flags that apply with --dra only.
var draOnly = []string{"kubeconfig", "prepare-timeout", "health-timeout", "rbac", "cleanup"}

// notWithCleanup are the flags of a run, which --cleanup has none of.
var notWithCleanup = []string{"rbac", "prepare-timeout", "health-timeout", "register-timeout", "reregister-threshold", "reregister-warn", "term-timeout", "junit"}

// draFlags completes dra from the shared flags: those not given keep
// the DRA defaults (a driver's re-registration threshold is 10s, not a
// device plugin's 5s).
func draFlags(cmd *cobra.Command, cfg verify.Config, dra verify.DRAConfig, args []string) verify.DRAConfig {
	dra.Command = args
	fl := cmd.Flags()
	if fl.Changed("register-timeout") {
		dra.RegisterTimeout = cfg.RegisterTimeout
	}
	if fl.Changed("reregister-threshold") {
		dra.ReregisterThreshold = cfg.ReregisterThreshold
	}
	if fl.Changed("reregister-warn") {
		dra.ReregisterWarn = cfg.ReregisterWarn
	}
	if fl.Changed("term-timeout") {
		dra.TermTimeout = cfg.TermTimeout
	}
	if fl.Changed("call-timeout") {
		dra.CallTimeout = cfg.CallTimeout
	}
	return dra
}

// draProblems checks a --dra command line before anything runs.
func draProblems(cmd *cobra.Command, dra verify.DRAConfig, junit string) error {
	var problems []string
	for _, f := range deviceOnly {
		if cmd.Flags().Changed(f) {
			problems = append(problems, "--"+f+": applies to device plugins only; leave it out with --dra")
		}
	}
	for _, d := range []struct {
		flag string
		v    any
		ok   bool
	}{
		{"--register-timeout", dra.RegisterTimeout, dra.RegisterTimeout >= 0},
		{"--reregister-threshold", dra.ReregisterThreshold, dra.ReregisterThreshold >= 0},
		{"--reregister-warn", dra.ReregisterWarn, dra.ReregisterWarn >= 0},
		{"--term-timeout", dra.TermTimeout, dra.TermTimeout >= 0},
		{"--call-timeout", dra.CallTimeout, dra.CallTimeout >= 0},
	} {
		if !d.ok {
			problems = append(problems, fmt.Sprintf("%s: %v: must be above 0", d.flag, d.v))
		}
	}
	if dra.PrepareTimeout <= 0 {
		problems = append(problems, fmt.Sprintf("--prepare-timeout: %s: must be above 0 (default %s, the kubelet's)", dra.PrepareTimeout, verify.DefaultPrepareTimeout))
	}
	if dra.HealthTimeout <= 0 {
		problems = append(problems, fmt.Sprintf("--health-timeout: %s: must be above 0 (default %s, the kubelet's)", dra.HealthTimeout, verify.DefaultDRAHealthTimeout))
	}
	if junit != "" {
		if msg := junitProblem(junit); msg != "" {
			problems = append(problems, "--junit: "+msg)
		}
	}
	for _, e := range dra.Problems() {
		if e.Field == "command" && e.Type == field.ErrorTypeRequired {
			problems = append(problems, "COMMAND: give the DRA driver command after --, e.g. dpkit verify --dra -- my-driver")
		}
	}
	switch len(problems) {
	case 0:
		return nil
	case 1:
		return errors.New(problems[0])
	}
	return fmt.Errorf("%d problem(s):\n  - %s", len(problems), strings.Join(problems, "\n  - "))
}

// verifier is the DRA verifier of env, or, in a dpkit without the
// Kubernetes client libraries, nil and what hands the command line over
// to dpkit-cluster.
func verifier(cmd *cobra.Command, env *cli.Env) (draVerifier, error) {
	if v, ok := env.Cluster.(draVerifier); ok {
		return v, nil
	}
	if env.HandOver != nil {
		return nil, env.HandOver(cmd)
	}
	return nil, errors.New("--dra: this build of dpkit cannot reach an API server; run dpkit-cluster verify --dra")
}

func runDRA(cmd *cobra.Command, env *cli.Env, kubeconfig string, dra verify.DRAConfig, format, junit string) error {
	if err := draProblems(cmd, dra, junit); err != nil {
		return cli.Exit(2, err)
	}
	v, err := verifier(cmd, env)
	if v == nil {
		return err
	}
	dra.Logger = env.Logger
	live := (format == output.Table || format == output.Wide) && isTerminal(env.Out)
	if live {
		lv := newLiveWriter(env.Out, format == output.Wide)
		dra.Progress = lv.result
		fmt.Fprintf(env.Out, "Verifying DRA driver %s against dpkit's DRA manager\n\n", strings.Join(dra.Command, " "))
	}
	rep, err := v.VerifyDRA(cmd.Context(), kubeconfig, dra)
	if err != nil {
		return err
	}
	return finish(env, rep, format, junit, live)
}

// finish writes the report and returns the exit status.
func finish(env *cli.Env, rep *verify.Report, format, junit string, live bool) error {
	if junit != "" {
		if err := writeJUnit(junit, rep); err != nil {
			return err
		}
	}
	var err error
	switch {
	case live:
		err = rep.WriteEnd(env.Out)
	case format == output.Table || format == output.Wide:
		err = rep.WriteTable(env.Out)
	default:
		err = output.Write(env.Out, format, rep, nil)
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
}

// cleanupProblems checks a --dra --cleanup command line.
func cleanupProblems(cmd *cobra.Command, args []string, cfg verify.DRACleanupConfig) error {
	var problems []string
	for _, f := range append(slices.Clone(deviceOnly), notWithCleanup...) {
		if cmd.Flags().Changed(f) {
			problems = append(problems, "--"+f+": applies to a run; leave it out with --cleanup")
		}
	}
	if len(args) > 0 {
		problems = append(problems, "COMMAND: --cleanup runs no driver; leave out "+strings.Join(args, " "))
	}
	if cfg.CallTimeout <= 0 {
		problems = append(problems, fmt.Sprintf("--call-timeout: %s: must be above 0", cfg.CallTimeout))
	}
	switch len(problems) {
	case 0:
		return nil
	case 1:
		return errors.New(problems[0])
	}
	return fmt.Errorf("%d problem(s):\n  - %s", len(problems), strings.Join(problems, "\n  - "))
}

// runCleanup runs dpkit verify --dra --cleanup: it removes what runs that
// ended without cleaning up left, and lists it. The exit status is 1 when
// something of such a run could not be removed.
func runCleanup(cmd *cobra.Command, env *cli.Env, kubeconfig string, cfg verify.DRACleanupConfig, format string, args []string) error {
	if err := cleanupProblems(cmd, args, cfg); err != nil {
		return cli.Exit(2, err)
	}
	v, err := verifier(cmd, env)
	if v == nil {
		return err
	}
	cfg.Logger = env.Logger
	rep, err := v.CleanupDRA(cmd.Context(), kubeconfig, cfg)
	if err != nil {
		return err
	}
	if format == output.Wide {
		format = output.Table
	}
	err = output.Write(env.Out, format, rep, func(w *tabwriter.Writer) error {
		if len(rep.Leftovers) == 0 {
			_, err := fmt.Fprintln(w, "Nothing to clean up: no run of dpkit verify --dra that has ended left anything.")
			return err
		}
		fmt.Fprintln(w, "RUN\tOBJECT\tACTION\tDETAIL")
		for _, l := range rep.Leftovers {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", cmp.Or(l.Run, "-"), l.Object, l.Action, l.Detail)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if rep.Failed() {
		return cli.Exit(1, errors.New("some of what runs that ended left could not be removed (ACTION failed)"))
	}
	return nil
}
