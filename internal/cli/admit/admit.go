// Package admit implements "dpkit admit": it admits a pod manifest through
// a running "dpkit kubelet" (or "dpkit up") and shows the devices and
// runtime options each container gets.
package admit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/emulator"
)

// Exit codes of "dpkit admit" besides 0 (admitted).
const (
	// exitRejected: the kubelet rejected the pod (its devices cannot be
	// allocated, the pod exists already) or could not be reached.
	exitRejected = 1
	// exitInvalid: bad flags or a manifest that is not a valid pod.
	exitInvalid = 2
)

// maxManifest bounds what is read from the manifest file, like the admin
// API does.
const maxManifest = 4 << 20

// NewCommand returns the "admit" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var root, socket, file, format string
	cmd := &cobra.Command{
		Use:   "admit -f POD.yaml",
		Short: "Admit a pod through a running dpkit kubelet and show the devices each container gets",
		Long: `Admit a Pod manifest (YAML or JSON, one document) through the admin API of a
running "dpkit kubelet" or "dpkit up", as the kubelet admits a pod bound to
its node: the device manager allocates the devices its init containers,
sidecars (init containers with restartPolicy: Always) and app containers
ask for, calling the plugins' GetPreferredAllocation and Allocate. The
command prints each container's devices and the runtime options (environment
variables, device nodes, mounts, annotations, CDI devices) the plugins
answered.

The manifest is checked first: a problem is reported with its field path.
A pod the kubelet rejects is reported with the reason and message the
kubelet would put in the pod's status (UnexpectedAdmissionError,
TopologyAffinityError).

A pod with DRA ResourceClaims (spec.resourceClaims) needs a dpkit kubelet
or dpkit up started with --kubeconfig: its claims are read from that API
server and prepared through the registered DRA drivers, and each container
shows its claims' devices and CDI devices. dpkit admit does not allocate
claims: each must already be allocated (by kube-scheduler, or any allocator)
and reserved for the pod (status.reservedFor with the pod's metadata.uid);
otherwise the pod is rejected (FailedPrepareDynamicResources) naming the
claim.

A pod asking for a resource no device plugin serves (a typo, say) is
admitted without devices for it, as a kubelet admits it; the command warns
about it on standard error and under the table.

Without --root, the root is $DPKIT_ROOT, else that of the last dpkit up or
dpkit kubelet started while it still runs, else /var/lib/kubelet.

Exit status: 0 admitted, 1 rejected or the kubelet is unreachable, 2 bad
flags or an invalid manifest. Remove an admitted pod with "dpkit delete pod".`,
		Example: `  dpkit admit --root /tmp/kubelet -f examples/pod.yaml
  dpkit admit --root /tmp/kubelet -f examples/pod.yaml -o json
  cat pod.yaml | dpkit admit --admin-socket /tmp/kubelet/dpkit/admin.sock -f -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			manifest, err := readManifest(env.In, file)
			if err != nil {
				return cli.Exit(exitInvalid, err)
			}
			if cmd.Flags().Changed("root") && root == "" {
				return cli.Exit(exitInvalid, errors.New("--root must not be empty; leave it out to use $DPKIT_ROOT or the last dpkit up's root"))
			}
			r := emulator.ChooseRoot(root, cmd.Flags().Changed("root"), env.Var)
			if socket == "" {
				socket = emulator.AdminSocket(r.Dir)
			}
			c := emulator.NewClient(socket)
			defer c.Close()
			return r.Explain(admitManifest(cmd.Context(), env.Out, env.Err, c, manifest, format))
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&file, "filename", "f", "", `pod manifest file, or "-" for standard input (required)`)
	fl.StringVar(&root, "root", "", "root directory of the dpkit kubelet (default: $DPKIT_ROOT, else the last dpkit up's or dpkit kubelet's while it runs, else "+emulator.DefaultRoot+")")
	fl.StringVar(&socket, "admin-socket", "", "admin API socket (default <root>/dpkit/admin.sock)")
	output.AddFlag(cmd, &format)
	_ = cmd.MarkFlagFilename("filename", "yaml", "yml", "json")
	_ = cmd.MarkFlagDirname("root")
	cmd.SetFlagErrorFunc(cli.FlagError)
	return cmd
}

// readManifest reads the manifest at path, "-" meaning in.
func readManifest(in io.Reader, path string) ([]byte, error) {
	var (
		data []byte
		err  error
	)
	switch path {
	case "":
		return nil, errors.New(`-f is required: give a pod manifest file, e.g. -f examples/pod.yaml, or "-f -" to read standard input`)
	case "-":
		if in == nil {
			return nil, errors.New("-f -: no standard input")
		}
		data, err = io.ReadAll(io.LimitReader(in, maxManifest+1))
	default:
		var f *os.File
		f, err = os.Open(path)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("-f %s: the file does not exist", path)
			}
			return nil, fmt.Errorf("-f %s: %w", path, err)
		}
		defer func() { _ = f.Close() }()
		data, err = io.ReadAll(io.LimitReader(f, maxManifest+1))
	}
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", path, err)
	}
	if len(data) > maxManifest {
		return nil, fmt.Errorf("-f %s: the manifest is larger than %d MiB", path, maxManifest>>20)
	}
	return data, nil
}

// admitManifest checks manifest, admits it through c and writes the
// admitted pod to w in format ("table", "json" or "yaml"), and the
// admission's warnings to errW. The error of a rejected pod exits with
// exitRejected and names the kubelet's reason; that of an invalid manifest
// exits with exitInvalid.
func admitManifest(ctx context.Context, w, errW io.Writer, c *emulator.Client, manifest []byte, format string) error {
	local, err := emulator.DecodePod(manifest)
	if err != nil {
		return cli.Exit(exitInvalid, err)
	}
	pod, err := c.AdmitPod(ctx, manifest)
	if err != nil {
		var ae *emulator.APIError
		switch {
		case errors.As(err, &ae) && ae.Reason != "":
			return cli.Exit(exitRejected, fmt.Errorf("pod %s/%s rejected by the kubelet: %s: %s", local.Namespace, local.Name, ae.Reason, ae.Message))
		case errors.As(err, &ae) && ae.StatusCode == http.StatusBadRequest:
			return cli.Exit(exitInvalid, err)
		case errors.As(err, &ae):
			return cli.Exit(exitRejected, fmt.Errorf("pod %s/%s: %w", local.Namespace, local.Name, err))
		}
		return cli.Exit(exitRejected, err)
	}
	if errW != nil {
		// On standard error too, where a script reading JSON or YAML from
		// standard output still shows it, as kubectl shows the API
		// server's warnings.
		for _, warning := range pod.Warnings {
			if _, err := fmt.Fprintln(errW, "Warning:", warning); err != nil {
				return err
			}
		}
	}
	return printPod(w, pod, format)
}

// printPod writes an admitted pod in format: "json", "yaml", or a table of
// its containers with their devices and runtime options, followed by a
// WARNING row for each of the admission's warnings.
func printPod(w io.Writer, pod *emulator.Pod, format string) error {
	if format == output.Table {
		if _, err := fmt.Fprintf(w, "pod %s/%s admitted (uid %s)\n\n", pod.Namespace, pod.Name, pod.UID); err != nil {
			return err
		}
	}
	err := output.Write(w, format, pod, func(t *tabwriter.Writer) error {
		fmt.Fprintln(t, "CONTAINER\tTYPE\tDEVICES\tRUNTIME OPTIONS")
		for _, c := range pod.Containers {
			devs := append(deviceLines(c.Devices), claimLines(c.Claims)...)
			opts := optionLines(c.Options)
			rows := max(len(devs), len(opts), 1)
			for i := range rows {
				name, typ := c.Name, c.Type
				if i > 0 {
					name, typ = "", ""
				}
				fmt.Fprintf(t, "%s\t%s\t%s\t%s\n", name, typ, line(devs, i), line(opts, i))
			}
		}
		return nil
	})
	if err != nil || format != output.Table {
		return err
	}
	for _, warning := range pod.Warnings {
		if _, err := fmt.Fprintln(w, "WARNING  "+warning); err != nil {
			return err
		}
	}
	return nil
}

func line(lines []string, i int) string {
	switch {
	case i < len(lines):
		return lines[i]
	case i == 0:
		return "-"
	}
	return ""
}

// deviceLines lists a container's devices per resource; IDs are shown as
// output.ID does, quoted when they have control characters or path
// separators.
func deviceLines(as []emulator.Allocation) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.Resource+": "+output.IDs(a.DeviceIDs))
	}
	return out
}

// claimLines lists a container's DRA claims with their devices,
// driver/pool/device (names the API server validated: DNS labels and
// subdomains, nothing to quote).
func claimLines(cs []emulator.ClaimAllocation) []string {
	out := make([]string, 0, len(cs))
	for _, c := range cs {
		out = append(out, "claim "+c.Claim+": "+strings.Join(c.Devices, ","))
	}
	return out
}

// optionLines renders runtime options in the container runtimes' own
// notation: env NAME=VALUE, device HOST:CONTAINER:PERMISSIONS,
// mount HOST:CONTAINER[:ro], annotation KEY=VALUE, cdi VENDOR/CLASS=NAME.
func optionLines(o *emulator.RuntimeOptions) []string {
	if o == nil {
		return nil
	}
	var out []string
	for _, e := range o.Envs {
		out = append(out, "env "+e.Name+"="+e.Value)
	}
	for _, d := range o.Devices {
		s := "device " + d.HostPath + ":" + d.ContainerPath
		if d.Permissions != "" {
			s += ":" + d.Permissions
		}
		out = append(out, s)
	}
	for _, m := range o.Mounts {
		s := "mount " + m.HostPath + ":" + m.ContainerPath
		if m.ReadOnly {
			s += ":ro"
		}
		out = append(out, s)
	}
	for _, a := range o.Annotations {
		out = append(out, "annotation "+a.Name+"="+a.Value)
	}
	for _, c := range o.CDIDevices {
		out = append(out, "cdi "+c)
	}
	return out
}
