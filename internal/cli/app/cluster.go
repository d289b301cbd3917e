package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
)

// ClusterBinary is the binary that has the commands needing the Kubernetes
// client libraries: dpkit node, dpkit advertise, and dpkit get, kubelet and
// up with --kubeconfig.
// dpkit runs it for those, so that "go run ./cmd/dpkit up" compiles none of
// client-go, virtual-kubelet or the apiserver libraries
// (docs/architecture.md, "Two binaries").
const ClusterBinary = "dpkit-cluster"

// installHint says how to get ClusterBinary, for the command %s. (A
// module zip cannot hold the sysfs fixtures' file names, so "go install
// ...@version" is no way to get it.)
const installHint = `install it next to dpkit or on PATH: in a dpkit checkout, "go install ./cmd/..."
installs dpkit and dpkit-cluster, "make build" builds both into bin/; or run
"go run ./cmd/dpkit-cluster %s ..." there`

// Option changes what Run and NewRootCommand assemble.
type Option func(*options)

type options struct {
	commands []func(*cli.Env) *cobra.Command
	cluster  cli.Cluster
	// lookPath finds dpkit-cluster; tests set it.
	lookPath func() (string, error)
}

// WithCommands adds commands to the tree, each replacing the command of
// the same name: cmd/dpkit-cluster replaces the stand-ins that run
// dpkit-cluster with the real node and advertise commands.
func WithCommands(cmds ...func(*cli.Env) *cobra.Command) Option {
	return func(o *options) { o.commands = append(o.commands, cmds...) }
}

// WithCluster gives the commands access to API servers (Env.Cluster), so
// that they run their cluster modes themselves instead of running
// dpkit-cluster.
func WithCluster(c cli.Cluster) Option {
	return func(o *options) { o.cluster = c }
}

// commands returns the subcommands: baseCommands, each replaced by the
// command of extra of the same name, then the other commands of extra.
func commands(env *cli.Env, d *dispatcher, extra []func(*cli.Env) *cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, f := range baseCommands(d) {
		out = append(out, f(env))
	}
	for _, f := range extra {
		c := f(env)
		if i := slices.IndexFunc(out, func(o *cobra.Command) bool { return o.Name() == c.Name() }); i >= 0 {
			out[i] = c
		} else {
			out = append(out, c)
		}
	}
	return out
}

// clusterFlags names, per command, the flag that needs Env.Cluster: with
// it set and no Env.Cluster, the command line is handed to dpkit-cluster.
var clusterFlags = map[string]string{"get": "kubeconfig", "kubelet": "kubeconfig", "up": "kubeconfig", "verify": "dra", "exporter": "kubeconfig"}

// dispatcher runs dpkit-cluster with the command line dpkit was given.
type dispatcher struct {
	env  *cli.Env
	args []string
	// lookPath finds dpkit-cluster: next to the running executable, then
	// on PATH.
	lookPath func() (string, error)
	// ran is set once the command line was handed to dpkit-cluster, whose
	// exit status is then dpkit's.
	ran bool
}

// clusterCommand is the stand-in for a command of dpkit-cluster: its help
// says where the command is, and running it runs dpkit-cluster.
func (d *dispatcher) clusterCommand(name, short string) func(*cli.Env) *cobra.Command {
	return func(*cli.Env) *cobra.Command {
		return &cobra.Command{
			Use:   name,
			Short: short,
			Long: short + `.

This command is in the ` + ClusterBinary + ` binary, with the Kubernetes client
libraries; dpkit runs ` + ClusterBinary + ` ` + name + ` with the same arguments
("` + ClusterBinary + ` ` + name + ` --help" shows its flags). dpkit looks for
` + ClusterBinary + ` next to its own executable, then on PATH.`,
			// Flags, --help included, are dpkit-cluster's to parse.
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				return d.run(cmd, append([]string{name}, args...))
			},
		}
	}
}

// handOver wraps cmd so that with its cluster flag set it runs
// dpkit-cluster with dpkit's whole command line.
func (d *dispatcher) handOver(cmd *cobra.Command, flag string) {
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if c.Flags().Changed(flag) {
			return d.run(c, d.args)
		}
		return run(c, args)
	}
}

// run runs dpkit-cluster with args and returns its exit status: nil, or
// an error that Reported recognizes (dpkit-cluster has said what went
// wrong).
func (d *dispatcher) run(cmd *cobra.Command, args []string) error {
	d.ran = true
	bin, err := d.lookPath()
	if err != nil {
		return fmt.Errorf("dpkit %s needs %s, which has the Kubernetes client libraries: %w;\n"+installHint, args[0], ClusterBinary, err, args[0])
	}
	c := exec.Command(bin, args...)
	c.Stdin, c.Stdout, c.Stderr = d.env.In, d.env.Out, d.env.Err
	// dpkit passes its own stdin, stdout and stderr on; where they are
	// not files (tests), processes dpkit-cluster leaves behind could hold
	// the pipes open: stop copying a while after it exits.
	c.WaitDelay = 5 * time.Second
	c.SysProcAttr = clusterProcAttr()
	if err := c.Start(); err != nil {
		return fmt.Errorf("running %s: %w", bin, err)
	}
	// On SIGINT or SIGTERM dpkit-cluster is asked to stop, as dpkit was,
	// and given the time it takes (dpkit advertise --remove-on-exit
	// removes its resources first).
	stop := context.AfterFunc(cmd.Context(), func() { _ = c.Process.Signal(syscall.SIGTERM) })
	err = c.Wait()
	stop()
	if c.ProcessState != nil && c.ProcessState.Success() {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		}
		return cli.Exit(code, reportedError{bin: bin, code: code})
	}
	if err != nil {
		return fmt.Errorf("running %s: %w", bin, err)
	}
	return nil
}

// reportedError is the failure of a dpkit-cluster run, which has already
// printed why.
type reportedError struct {
	bin  string
	code int
}

func (e reportedError) Error() string { return fmt.Sprintf("%s exited with status %d", e.bin, e.code) }

// Reported reports whether err was already told to the user by
// dpkit-cluster, so that main prints nothing more and only exits with
// ExitCode(err).
func Reported(err error) bool {
	var re reportedError
	return errors.As(err, &re)
}

// findClusterBinary returns dpkit-cluster next to the running executable
// (where go install and make build put it), else the one PATH finds.
func findClusterBinary() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return findClusterBinaryFrom(exe, exec.LookPath)
}

// findClusterBinaryFrom looks for dpkit-cluster in the directory of exe,
// then in the directory of the file exe links to, then through lookPath.
func findClusterBinaryFrom(exe string, lookPath func(string) (string, error)) (string, error) {
	var dirs []string
	if exe != "" {
		dirs = append(dirs, filepath.Dir(exe))
		if real, err := filepath.EvalSymlinks(exe); err == nil && filepath.Dir(real) != dirs[0] {
			dirs = append(dirs, filepath.Dir(real))
		}
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, ClusterBinary)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	if p, err := lookPath(ClusterBinary); err == nil {
		return p, nil
	}
	where := "on PATH"
	if len(dirs) > 0 {
		where = "in " + strings.Join(dirs, ", ") + " or on PATH"
	}
	return "", fmt.Errorf("no %s %s", ClusterBinary, where)
}
