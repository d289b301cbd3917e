// Package deletecmd implements "dpkit delete": it removes pods from a
// running "dpkit kubelet" and frees their devices.
package deletecmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/natural"
)

// maxManifest bounds what is read from a manifest, like the admin API
// does.
const maxManifest = 4 << 20

// NewCommand returns the "delete" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var root, socket, namespace, file, format string
	cmd := &cobra.Command{
		Use:   "delete pod NAME... | delete -f POD.yaml",
		Short: "Delete pods from a running dpkit kubelet and free their devices",
		Long: `Delete pods from a running dpkit kubelet (or dpkit up) and free their devices:
by name (in --namespace), or the pod of a manifest with -f, as kubectl does.

Without --root, the root is $DPKIT_ROOT, else that of the last dpkit up or
dpkit kubelet started while it still runs, else /var/lib/kubelet.

Exit status: 0 deleted, 1 a pod is not there or the kubelet is unreachable,
2 bad usage.`,
		Example: `  dpkit delete pod trainer --root /tmp/kubelet
  dpkit delete pod trainer -n ml --admin-socket /tmp/kubelet/dpkit/admin.sock
  dpkit delete -f examples/pod.yaml -o json`,
		Args: func(_ *cobra.Command, args []string) error {
			if file != "" {
				if len(args) > 0 {
					return cli.Exit(2, fmt.Errorf("give pod names or -f, not both"))
				}
				return nil
			}
			if len(args) == 0 {
				return cli.Exit(2, errors.New(`name the pods to delete, "dpkit delete pod NAME...", or give a manifest with -f`))
			}
			if k := strings.ToLower(args[0]); k != "pod" && k != "pods" && k != "po" {
				return cli.Exit(2, fmt.Errorf("unknown kind %q; only pods can be deleted: dpkit delete pod NAME [NAME ...]", args[0]))
			}
			if len(args) == 1 {
				return cli.Exit(2, errors.New("name the pods to delete: dpkit delete pod NAME [NAME ...]"))
			}
			return nil
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 0 {
				return []string{"pod"}, cobra.ShellCompDirectiveNoFileComp
			}
			r := emulator.ChooseRoot(root, cmd.Flags().Changed("root"), env.Var)
			return podNames(socketOf(socket, r), namespace, args[1:]), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("root") && root == "" {
				return cli.Exit(2, errors.New("--root must not be empty; leave it out to use $DPKIT_ROOT or the last dpkit up's root"))
			}
			var names []string
			if file != "" {
				ns, name, err := fromManifest(env.In, file)
				if err != nil {
					return cli.Exit(2, err)
				}
				if cmd.Flags().Changed("namespace") && namespace != ns {
					return cli.Exit(2, fmt.Errorf("-f %s: the pod's namespace %q does not match --namespace %q; leave --namespace out", file, ns, namespace))
				}
				namespace, names = ns, []string{name}
			} else {
				names = args[1:]
			}
			r := emulator.ChooseRoot(root, cmd.Flags().Changed("root"), env.Var)
			c := emulator.NewClient(socketOf(socket, r))
			defer c.Close()
			return r.Explain(deletePods(cmd.Context(), env.Out, c, namespace, names, format))
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&namespace, "namespace", "n", "default", "namespace of the pods")
	fl.StringVarP(&file, "filename", "f", "", `manifest of the pod to delete, or "-" for standard input`)
	fl.StringVar(&root, "root", "", "root directory of the dpkit kubelet (default: $DPKIT_ROOT, else the last dpkit up's or dpkit kubelet's while it runs, else "+emulator.DefaultRoot+")")
	fl.StringVar(&socket, "admin-socket", "", "admin API socket (default <root>/dpkit/admin.sock)")
	output.AddFlag(cmd, &format)
	_ = cmd.MarkFlagDirname("root")
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	cmd.SetFlagErrorFunc(cli.FlagError)
	return cmd
}

func socketOf(flag string, r emulator.Root) string {
	if flag != "" {
		return flag
	}
	return emulator.AdminSocket(r.Dir)
}

// completionTimeout bounds asking the emulator for pod names.
const completionTimeout = 5 * time.Second

// podNames returns the names of the pods of namespace the emulator at
// socket has, but those already on the command line, for shell
// completion.
func podNames(socket, namespace string, given []string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	c := emulator.NewClient(socket)
	defer c.Close()
	pods, _ := c.Pods(ctx)
	var out []string
	for _, p := range pods {
		if p.Namespace == namespace && !slices.Contains(given, p.Name) {
			out = append(out, p.Name)
		}
	}
	natural.Sort(out)
	return out
}

// fromManifest returns the namespace and name of the pod in the manifest
// at path ("-": in), decoded as "dpkit admit" decodes it.
func fromManifest(in io.Reader, path string) (namespace, name string, err error) {
	var data []byte
	switch path {
	case "-":
		if in == nil {
			return "", "", errors.New("-f -: no standard input")
		}
		data, err = io.ReadAll(io.LimitReader(in, maxManifest+1))
	default:
		var f *os.File
		if f, err = os.Open(path); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return "", "", fmt.Errorf("-f %s: the file does not exist", path)
			}
			return "", "", fmt.Errorf("-f %s: %w", path, err)
		}
		defer func() { _ = f.Close() }()
		data, err = io.ReadAll(io.LimitReader(f, maxManifest+1))
	}
	if err != nil {
		return "", "", fmt.Errorf("-f %s: %w", path, err)
	}
	if len(data) > maxManifest {
		return "", "", fmt.Errorf("-f %s: the manifest is larger than %d MiB", path, maxManifest>>20)
	}
	pod, err := emulator.DecodePod(data)
	if err != nil {
		return "", "", fmt.Errorf("-f %s: %w", path, err)
	}
	return pod.Namespace, pod.Name, nil
}

// deletePods deletes the pods names of namespace through c, going on
// past the ones that are not there, and writes what it deleted to w in
// format: a line per pod, or the deleted pods as a JSON or YAML list.
func deletePods(ctx context.Context, w io.Writer, c *emulator.Client, namespace string, names []string, format string) error {
	deleted := []*emulator.Pod{}
	var errs []error
	for _, name := range names {
		pod, err := c.DeletePod(ctx, namespace, name)
		if err != nil {
			if !emulator.IsNotFound(err) {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, err)
			continue
		}
		deleted = append(deleted, pod)
		if format == output.Table {
			if _, err := fmt.Fprintf(w, "pod %q deleted from namespace %q\n", pod.Name, pod.Namespace); err != nil {
				return err
			}
		}
	}
	if format != output.Table {
		if err := output.Write(w, format, deleted, func(*tabwriter.Writer) error { return nil }); err != nil {
			return err
		}
	}
	return errors.Join(errs...)
}
