// Package deletecmd implements "dpkit delete": it removes a pod from a
// running "dpkit kubelet" and frees its devices.
package deletecmd

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
)

// NewCommand returns the "delete" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var root, socket, namespace string
	cmd := &cobra.Command{
		Use:   "delete pod NAME",
		Short: "Delete a pod from a running dpkit kubelet and free its devices",
		Example: `  dpkit delete pod trainer --root /tmp/kubelet
  dpkit delete pod trainer -n ml --admin-socket /tmp/kubelet/dpkit/admin.sock`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if k := strings.ToLower(args[0]); k != "pod" && k != "pods" && k != "po" {
				return cli.Exit(2, fmt.Errorf("unknown kind %q; only pods can be deleted", args[0]))
			}
			if socket == "" {
				socket = emulator.AdminSocket(root)
			}
			c := emulator.NewClient(socket)
			defer c.Close()
			if _, err := c.DeletePod(cmd.Context(), namespace, args[1]); err != nil {
				return err
			}
			_, err := fmt.Fprintf(env.Out, "pod %q deleted from namespace %q\n", args[1], namespace)
			return err
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&namespace, "namespace", "n", "default", "namespace of the pod")
	fl.StringVar(&root, "root", emulator.DefaultRoot, "root directory of the dpkit kubelet")
	fl.StringVar(&socket, "admin-socket", "", "admin API socket (default <root>/dpkit/admin.sock)")
	return cmd
}
