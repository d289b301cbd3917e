// Package advertise implements "dpkit advertise": set or remove extended
// resources on a node, once or as a controller that keeps them there.
package advertise

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/pkg/configfile"
	"github.com/dpkit/dpkit/pkg/extresource"
)

// envNodeName is read for --node when the flag is not given, so a DaemonSet
// can pass spec.nodeName through the downward API.
const envNodeName = "NODE_NAME"

type options struct {
	kubeconfig      string
	node            string
	remove          []string
	file            string
	watch           bool
	removeOnExit    bool
	dryRun          bool
	skipAllocatable bool
	qps             float32
	burst           int
}

// NewCommand returns the "advertise" command.
func NewCommand(env *cli.Env) *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "advertise [NAME=QUANTITY ...]",
		Short: "Advertise extended resources on a node",
		Long: `Advertise extended resources (example.com/dongle=4) in a node's status so the
scheduler can place pods that request them.

Once:        dpkit advertise --node N example.com/dongle=4 example.com/widget=2
Remove:      dpkit advertise --node N --remove example.com/dongle
Preview:     dpkit advertise --node N example.com/dongle=4 --dry-run
From a file: dpkit advertise --node N -f resources.yaml
Controller:  dpkit advertise --node N -f resources.yaml --watch --remove-on-exit

Names are domain-qualified and outside kubernetes.io; quantities are whole
numbers, 0 or more. Capacity and allocatable are both written (see
--skip-allocatable). With --watch the command keeps the resources on the node
until it is stopped: it restores them when another writer drops them and
follows changes to the file. Without --kubeconfig it uses $KUBECONFIG or
~/.kube/config, and the in-cluster configuration inside a pod.
See docs/extended-resources.md.`,
		Example: `  dpkit advertise --kubeconfig ~/.kube/config --node worker-1 example.com/dongle=4`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return run(cmd, env, o, args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config, then in-cluster)")
	f.StringVar(&o.node, "node", "", "node to advertise on (default: $"+envNodeName+")")
	f.StringArrayVar(&o.remove, "remove", nil, "extended resource to remove from the node (repeatable)")
	f.StringVarP(&o.file, "file", "f", "", "resources file (apiVersion: dpkit.io/v1alpha1, kind: ExtendedResources)")
	f.BoolVar(&o.watch, "watch", false, "keep the resources on the node until stopped, following the node and the file")
	f.BoolVar(&o.removeOnExit, "remove-on-exit", false, "with --watch: remove the resources when stopped (SIGTERM, SIGINT)")
	f.BoolVar(&o.dryRun, "dry-run", false, "print the JSON Patch that would be sent and change nothing")
	f.BoolVar(&o.skipAllocatable, "skip-allocatable", false, "write capacity only and leave allocatable to the kubelet")
	f.Float32Var(&o.qps, "qps", 5, "client queries per second to the apiserver")
	f.IntVar(&o.burst, "burst", 10, "client burst of queries to the apiserver")
	return cmd
}

func usageError(err error) error { return cli.Exit(2, err) }

func run(cmd *cobra.Command, env *cli.Env, o *options, args []string) error {
	if o.node == "" {
		o.node = os.Getenv(envNodeName)
	}
	set, err := extresource.ParseAssignments(args, field.NewPath("args"))
	if err != nil {
		return usageError(err)
	}
	if err := extresource.ValidateNames(o.remove, field.NewPath("--remove")); err != nil {
		return usageError(err)
	}
	var problems []string
	if o.node == "" {
		problems = append(problems, "--node is required (or set $"+envNodeName+")")
	}
	if len(set) == 0 && len(o.remove) == 0 && o.file == "" {
		problems = append(problems, "nothing to do: give NAME=QUANTITY arguments, --remove NAME or -f FILE")
	}
	for _, n := range o.remove {
		if _, ok := set[corev1.ResourceName(n)]; ok {
			problems = append(problems, fmt.Sprintf("%s is both set and removed", n))
		}
	}
	if o.watch && len(o.remove) > 0 {
		problems = append(problems, "--remove cannot be used with --watch; leave the resource out of the file instead")
	}
	if o.watch && o.dryRun {
		problems = append(problems, "--dry-run cannot be used with --watch")
	}
	if o.removeOnExit && !o.watch {
		problems = append(problems, "--remove-on-exit needs --watch")
	}
	if o.qps <= 0 || o.burst <= 0 {
		problems = append(problems, "--qps and --burst must be more than 0")
	}
	if len(problems) > 0 {
		return usageError(errors.New(strings.Join(problems, "; ")))
	}

	allocatable := !o.skipAllocatable
	if o.file != "" && !o.watch {
		spec, err := extresource.Load(o.file)
		if err != nil {
			return usageError(err)
		}
		// Flags override the file.
		for n, q := range spec.List() {
			if _, ok := set[n]; !ok {
				set[n] = q
			}
		}
		if !*spec.Allocatable {
			allocatable = false
		}
	}

	client, err := newClient(o)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if o.watch {
		var spec *extresource.ExtendedResources
		if o.file == "" {
			spec = &extresource.ExtendedResources{TypeMeta: configfile.TypeMeta{APIVersion: configfile.APIVersion, Kind: extresource.Kind}, Allocatable: &allocatable}
		}
		ctrl, err := extresource.NewController(extresource.ControllerConfig{
			Client:       client,
			NodeName:     o.node,
			File:         o.file,
			Resources:    spec,
			Overrides:    set,
			RemoveOnExit: o.removeOnExit,
			Logger:       env.Logger,
		})
		if err != nil {
			return usageError(err)
		}
		return ctrl.Run(ctx)
	}

	remove := make([]corev1.ResourceName, 0, len(o.remove))
	for _, n := range o.remove {
		remove = append(remove, corev1.ResourceName(n))
	}
	adv, err := extresource.NewAdvertiser(extresource.AdvertiserConfig{Client: client, SkipAllocatable: !allocatable, Logger: env.Logger})
	if err != nil {
		return err
	}
	if o.dryRun {
		patch, _, err := adv.Plan(ctx, o.node, set, remove)
		if err != nil {
			return err
		}
		if patch == nil {
			patch = extresource.Patch{}
		}
		enc := json.NewEncoder(env.Out)
		enc.SetIndent("", "  ")
		return enc.Encode(patch)
	}
	change, err := adv.Apply(ctx, o.node, set, remove)
	if err != nil {
		return err
	}
	printChange(env, o.node, change)
	return nil
}

func printChange(env *cli.Env, node string, c extresource.Change) {
	if c.Empty() {
		fmt.Fprintf(env.Out, "node/%s: unchanged\n", node)
		return
	}
	names := make([]string, 0, len(c.Set))
	for n := range c.Set {
		names = append(names, string(n))
	}
	sort.Strings(names)
	for _, n := range names {
		q := c.Set[corev1.ResourceName(n)]
		fmt.Fprintf(env.Out, "node/%s: set %s=%s\n", node, n, q.String())
	}
	for _, n := range c.Removed {
		fmt.Fprintf(env.Out, "node/%s: removed %s\n", node, n)
	}
}

// newClient builds the client: --kubeconfig, else the usual loading rules,
// else the in-cluster configuration.
func newClient(o *options) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kubeconfig != "" {
		rules.ExplicitPath = o.kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("client configuration: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS = o.qps
	cfg.Burst = o.burst
	cfg.UserAgent = "dpkit-advertise"
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	return c, nil
}
