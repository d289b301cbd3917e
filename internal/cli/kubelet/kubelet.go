// Package kubelet implements "dpkit kubelet": an emulated kubelet device
// manager that real device plugins register with, without a cluster. It
// serves the registration socket (device-plugins/kubelet.sock), watches
// plugins_registry, serves the PodResources API and an admin API that
// "dpkit get" and "dpkit delete" use. The emulator itself is
// internal/emulator.
package kubelet

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/emulator"
)

// NewCommand returns the "kubelet" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var (
		o          emulator.Options
		topo       cli.Topology
		kubeconfig string
	)
	cmd := &cobra.Command{
		Use:   "kubelet [--root DIR]",
		Short: "Run an emulated kubelet device manager that device plugins register with",
		Long: `Run the device-plugin side of a kubelet without a cluster: the registration
socket <root>/device-plugins/kubelet.sock, the plugin watcher on
<root>/plugins_registry, the PodResources API on
<root>/pod-resources/kubelet.sock, and an admin API on
<root>/dpkit/admin.sock for "dpkit get" and "dpkit delete".

Pods are admitted with "dpkit admit" (or by POSTing a pod manifest to
/v1/pods on the admin socket); admitted pods are kept under
<root>/dpkit/pods and survive restarts, like the device manager's
checkpoint. The root is recorded (in $XDG_STATE_HOME/dpkit/last-root) so
that "dpkit get", "admit" and "delete" find it without --root while this
runs. One process serves a root: a second one on the same root, or on a
root a kubelet serves, fails and names the first. Stop with SIGINT/SIGTERM.

DRA drivers register through plugins_registry too. With --kubeconfig, the
ResourceClaims of an admitted pod are read from that API server and
prepared through their drivers; dpkit admit shows each container's CDI
devices. Claims are not allocated here: kube-scheduler (or any allocator)
must have allocated them and reserved them for the pod. Without
--kubeconfig a pod with claims is refused.`,
		Example: `  dpkit kubelet --root /tmp/kubelet
  dpkit kubelet --root /tmp/kubelet --topology-policy single-numa-node
  dpkit kubelet --root /tmp/kubelet --topology-policy restricted --numa-nodes 0,1
  dpkit kubelet --root /tmp/kubelet --kubeconfig k.conf
  dpkit kubelet --root /tmp/kubelet --device-admission-wait 2m
  curl --unix-socket /tmp/kubelet/dpkit/admin.sock --data-binary @pod.yaml http://dpkit/v1/pods`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Logger = env.Logger
			if o.Root == "" {
				return cli.Exit(2, errRootRequired)
			}
			if err := topo.Validate(); err != nil {
				return err
			}
			if o.AdmissionWait < 0 {
				return cli.Exit(2, fmt.Errorf("--device-admission-wait %s: must not be negative; 0 refuses a pod whose plugin is not back at once, as the kubelet", o.AdmissionWait))
			}
			o.TopologyPolicy, o.TopologyScope, o.NUMANodes, o.SysfsRoot = topo.Policy, topo.Scope, topo.NUMANodes, topo.SysfsRoot
			if kubeconfig != "" {
				// dpkit hands this command line to dpkit-cluster, which
				// has the API server clients (Env.Cluster).
				if env.Cluster == nil {
					return errors.New("--kubeconfig needs the API server clients of dpkit-cluster")
				}
				r, err := env.Cluster.DRA(kubeconfig)
				if err != nil {
					return cli.Exit(2, fmt.Errorf("--kubeconfig: %w", err))
				}
				o.Claims = emulator.ClaimsFromJSON(r.ClaimJSON)
				o.Allocator = emulator.AllocatorFromJSON(r.Allocate, r.Release)
			}
			return emulator.Run(cmd.Context(), o, func(*emulator.Emulator) {
				// "dpkit get", "admit" and "delete" find this root without
				// --root while it runs.
				if err := emulator.RecordRoot(o.Root, env.Var); err != nil && env.Logger != nil {
					env.Logger.Warn("Cannot record the root for the client commands", "err", err)
				}
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.Root, "root", emulator.DefaultRoot, "directory standing for the kubelet's root directory")
	topo.AddFlags(cmd)
	fl.StringVar(&kubeconfig, "kubeconfig", "", "read the ResourceClaims of admitted pods from the API server of this kubeconfig, allocate those not allocated for --node-name with the scheduler's allocator, and prepare them through their DRA drivers (runs dpkit-cluster; default: pods with claims are refused)")
	fl.StringVar(&o.NodeName, "node-name", "", "the node this kubelet is: claims are allocated from the devices published for it (default: the host's name)")
	fl.StringVar(&o.AdminSocket, "admin-socket", "", "admin API socket (default <root>/dpkit/admin.sock)")
	fl.DurationVar(&o.AdmissionWait, "device-admission-wait", 0, "hold an admission asking for a device-plugin resource the checkpoint knows until its plugin serves it again, up to this long, instead of refusing it with UnexpectedAdmissionError as the kubelet does (0: the kubelet's behaviour)")
	cmd.SetFlagErrorFunc(cli.FlagError)
	return cmd
}

type constError string

func (e constError) Error() string { return string(e) }

const errRootRequired = constError("--root must not be empty")
