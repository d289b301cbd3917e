// Package get implements "dpkit get": it shows what a running
// "dpkit kubelet" knows: resources, devices, plugins and pods.
package get

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/kubelet"
	"github.com/dpkit/dpkit/internal/cli/output"
)

// kinds maps every accepted kind name to its canonical name.
var kinds = map[string]string{
	"resources": "resources", "resource": "resources", "res": "resources",
	"devices": "devices", "device": "devices", "dev": "devices",
	"plugins": "plugins", "plugin": "plugins",
	"pods": "pods", "pod": "pods", "po": "pods",
}

// NewCommand returns the "get" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var root, socket, format string
	cmd := &cobra.Command{
		Use:   "get resources|devices|plugins|pods",
		Short: "Show the resources, devices, plugins or pods of a running dpkit kubelet",
		Example: `  dpkit get resources --root /tmp/kubelet
  dpkit get devices --root /tmp/kubelet -o yaml
  dpkit get pods --admin-socket /tmp/kubelet/dpkit/admin.sock -o json`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"resources", "devices", "plugins", "pods"},
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, ok := kinds[strings.ToLower(args[0])]
			if !ok {
				return cli.Exit(2, fmt.Errorf("unknown kind %q; use resources, devices, plugins or pods", args[0]))
			}
			if err := output.Check(format); err != nil {
				return cli.Exit(2, err)
			}
			if socket == "" {
				socket = kubelet.AdminSocket(root)
			}
			c := kubelet.NewClient(socket)
			defer c.Close()
			return Run(cmd.Context(), env.Out, c, kind, format)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&root, "root", kubelet.DefaultRoot, "root directory of the dpkit kubelet")
	fl.StringVar(&socket, "admin-socket", "", "admin API socket (default <root>/dpkit/admin.sock)")
	fl.StringVarP(&format, "output", "o", output.Table, "output format: table, json or yaml")
	return cmd
}

// Run fetches kind ("resources", "devices", "plugins" or "pods") and
// writes it to w in format ("table", "json" or "yaml").
func Run(ctx context.Context, w io.Writer, c *kubelet.Client, kind, format string) error {
	var (
		v   any
		tab func(*tabwriter.Writer)
	)
	switch kind {
	case "resources":
		rs, err := c.Resources(ctx)
		if err != nil {
			return err
		}
		v = rs
		tab = func(t *tabwriter.Writer) {
			fmt.Fprintln(t, "NAME\tCAPACITY\tALLOCATABLE\tIN USE\tCONNECTED")
			for _, r := range rs {
				fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%t\n", r.Name, r.Capacity, r.Allocatable, r.InUse, r.Connected)
			}
		}
	case "devices":
		ds, err := c.Devices(ctx)
		if err != nil {
			return err
		}
		v = ds
		tab = func(t *tabwriter.Writer) {
			fmt.Fprintln(t, "RESOURCE\tID\tHEALTHY\tNUMA\tPOD UID")
			for _, d := range ds {
				fmt.Fprintf(t, "%s\t%s\t%t\t%s\t%s\n", d.Resource, d.ID, d.Healthy, joinInts(d.NUMANodes), orDash(d.PodUID))
			}
		}
	case "plugins":
		ps, err := c.Plugins(ctx)
		if err != nil {
			return err
		}
		v = ps
		tab = func(t *tabwriter.Writer) {
			fmt.Fprintln(t, "SOCKET\tTYPE\tNAME\tENDPOINT\tVERSIONS\tSTATUS")
			for _, p := range ps.Registered {
				fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\tregistered\n", p.SocketPath, p.Type, p.Name, p.Endpoint, strings.Join(p.Versions, ","))
			}
			for _, f := range ps.Failing {
				fmt.Fprintf(t, "%s\t-\t-\t-\t-\tfailing (%d): %s\n", f.SocketPath, f.Failures, f.LastError)
			}
		}
	case "pods":
		ps, err := c.Pods(ctx)
		if err != nil {
			return err
		}
		v = ps
		tab = func(t *tabwriter.Writer) {
			fmt.Fprintln(t, "NAMESPACE\tNAME\tCONTAINER\tRESOURCE\tDEVICES")
			for _, p := range ps {
				for _, c := range p.Containers {
					if len(c.Devices) == 0 {
						fmt.Fprintf(t, "%s\t%s\t%s\t-\t-\n", p.Namespace, p.Name, c.Name)
					}
					for _, d := range c.Devices {
						fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, c.Name, d.Resource, strings.Join(d.DeviceIDs, ","))
					}
				}
			}
		}
	default:
		return fmt.Errorf("unknown kind %q", kind)
	}
	return output.Write(w, format, v, func(t *tabwriter.Writer) error {
		tab(t)
		return nil
	})
}

func joinInts(v []int64) string {
	if len(v) == 0 {
		return "-"
	}
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
