package verify

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/pkg/verify"
)

// draVerifier runs dpkit verify --dra; dpkit-cluster's Env.Cluster has it
// (pkg/verify/draverify needs client-go), dpkit hands --dra over.
type draVerifier interface {
	VerifyDRA(ctx context.Context, cfg verify.DRAConfig) (*verify.Report, error)
}

// deviceOnly are the flags that apply to device plugins only.
var deviceOnly = []string{"socket-dir", "private-mount", "plugin-watcher", "restarts", "quiet-period", "health-wait"}

// draOnly are the flags that apply with --dra only.
var draOnly = []string{"kubeconfig", "prepare-timeout", "health-timeout"}

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
			problems = append(problems, "COMMAND: "+e.Detail)
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

func runDRA(cmd *cobra.Command, env *cli.Env, dra verify.DRAConfig, format, junit string) error {
	if err := draProblems(cmd, dra, junit); err != nil {
		return cli.Exit(2, err)
	}
	v, ok := env.Cluster.(draVerifier)
	if !ok {
		if env.HandOver != nil {
			return env.HandOver(cmd)
		}
		return errors.New("--dra: this build of dpkit cannot reach an API server; run dpkit-cluster verify --dra")
	}
	dra.Logger = env.Logger
	live := (format == output.Table || format == output.Wide) && isTerminal(env.Out)
	if live {
		lv := newLiveWriter(env.Out, format == output.Wide)
		dra.Progress = lv.result
		fmt.Fprintf(env.Out, "Verifying DRA driver %s against dpkit's DRA manager\n\n", strings.Join(dra.Command, " "))
	}
	rep, err := v.VerifyDRA(cmd.Context(), dra)
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
