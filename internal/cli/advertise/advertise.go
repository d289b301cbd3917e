// Package advertise implements "dpkit advertise": set or remove extended
// resources on a node, once or as a controller that keeps them there.
package advertise

import (
	"fmt"
	"os"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/kubeconfig"
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
	output          string
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
	output.AddFlag(cmd, &o.output)
	f.Lookup("output").Usage = "output format of what was set and removed: table, json or yaml (--dry-run: the JSON Patch, as JSON or YAML)"
	return cmd
}

func usageError(err error) error { return cli.Exit(2, err) }

// check reports every problem of the arguments and flags at once, each
// named by its flag ("--node") or argument ("args[0].name"), and returns
// the resources the arguments set.
func check(o *options, args []string) (corev1.ResourceList, field.ErrorList) {
	set, errs := extresource.ParseAssignments(args, field.NewPath("args"))
	errs = append(errs, extresource.ValidateNames(o.remove, field.NewPath("--remove"))...)
	if o.node == "" {
		errs = append(errs, field.Required(field.NewPath("--node"), "name the node to advertise on, or set $"+envNodeName))
	}
	if len(args) == 0 && len(o.remove) == 0 && o.file == "" {
		errs = append(errs, field.Required(field.NewPath("args"), "nothing to do: give NAME=QUANTITY arguments, --remove NAME or -f FILE"))
	}
	for i, n := range o.remove {
		if _, ok := set[corev1.ResourceName(n)]; ok {
			errs = append(errs, field.Invalid(field.NewPath("--remove").Index(i), n, "is both set and removed; keep one"))
		}
	}
	if o.watch && len(o.remove) > 0 {
		errs = append(errs, field.Forbidden(field.NewPath("--remove"), "cannot be used with --watch; leave the resource out of the file instead"))
	}
	if o.watch && o.dryRun {
		errs = append(errs, field.Forbidden(field.NewPath("--dry-run"), "cannot be used with --watch"))
	}
	if o.removeOnExit && !o.watch {
		errs = append(errs, field.Forbidden(field.NewPath("--remove-on-exit"), "needs --watch"))
	}
	if o.qps <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("--qps"), o.qps, "must be more than 0"))
	}
	if o.burst <= 0 {
		errs = append(errs, field.Invalid(field.NewPath("--burst"), o.burst, "must be more than 0"))
	}
	return set, errs
}

func run(cmd *cobra.Command, env *cli.Env, o *options, args []string) error {
	if o.node == "" {
		o.node = os.Getenv(envNodeName)
	}
	set, errs := check(o, args)
	if len(errs) > 0 {
		return usageError(configfile.Problems(errs))
	}

	allocatable := !o.skipAllocatable
	if o.file != "" {
		// Checked here in --watch mode too, so a bad file is a usage
		// error before anything talks to the cluster.
		spec, err := extresource.Load(o.file)
		if err != nil {
			return usageError(fmt.Errorf("--file %w", err))
		}
		if !o.watch {
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
	}

	client, err := newClient(o)
	if err != nil {
		return usageError(err)
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
		format := o.output
		if format == output.Table {
			format = output.JSON // a JSON Patch reads best as itself
		}
		return output.Write(env.Out, format, patch, nil)
	}
	change, err := adv.Apply(ctx, o.node, set, remove)
	if err != nil {
		return err
	}
	r := newResult(o.node, change)
	return output.Write(env.Out, o.output, r, r.table)
}

// result is what the one-shot command did to the node, as -o json and -o
// yaml print it.
type result struct {
	Node string `json:"node"`
	// Changed is false when the node already matched.
	Changed bool `json:"changed"`
	// Set maps each resource written to its quantity.
	Set map[string]string `json:"set"`
	// Removed lists the resources deleted from the node.
	Removed []string `json:"removed"`
}

func newResult(node string, c extresource.Change) result {
	r := result{Node: node, Changed: !c.Empty(), Set: map[string]string{}, Removed: []string{}}
	for n, q := range c.Set {
		r.Set[string(n)] = q.String()
	}
	for _, n := range c.Removed {
		r.Removed = append(r.Removed, string(n))
	}
	return r
}

// table writes one line per change, "node/NAME: set example.com/dongle=4",
// or "node/NAME: unchanged".
func (r result) table(w *tabwriter.Writer) error {
	if !r.Changed {
		_, err := fmt.Fprintf(w, "node/%s: unchanged\n", r.Node)
		return err
	}
	names := make([]string, 0, len(r.Set))
	for n := range r.Set {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := fmt.Fprintf(w, "node/%s: set %s=%s\n", r.Node, n, r.Set[n]); err != nil {
			return err
		}
	}
	for _, n := range r.Removed {
		if _, err := fmt.Fprintf(w, "node/%s: removed %s\n", r.Node, n); err != nil {
			return err
		}
	}
	return nil
}

// newClient builds the client from --kubeconfig, $KUBECONFIG,
// ~/.kube/config or the in-cluster configuration (internal/kubeconfig).
func newClient(o *options) (kubernetes.Interface, error) {
	cfg, err := kubeconfig.Load(o.kubeconfig)
	if err != nil {
		return nil, err
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
