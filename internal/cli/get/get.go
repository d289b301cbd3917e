// Package get implements "dpkit get": it shows what a running
// "dpkit kubelet" knows (resources, devices, plugins, through its admin
// API) and the pods and devices of any kubelet-like process (through the
// PodResources API: dpkit kubelet, dpkit up, dpkit node, or a real kubelet).
package get

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/dpkit/dpkit/internal/cli"
	"github.com/dpkit/dpkit/internal/cli/output"
	"github.com/dpkit/dpkit/internal/emulator"
	"github.com/dpkit/dpkit/internal/natural"
	"github.com/dpkit/dpkit/pkg/pluginwatcher"
	"github.com/dpkit/dpkit/pkg/podresources"
	"github.com/dpkit/dpkit/pkg/podresources/prclient"
)

// kinds maps every accepted kind name to its canonical name.
var kinds = map[string]string{
	"resources": "resources", "resource": "resources", "res": "resources",
	"devices": "devices", "device": "devices", "dev": "devices",
	"plugins": "plugins", "plugin": "plugins",
	"pods": "pods", "pod": "pods", "po": "pods",
	"claims": "claims", "claim": "claims", "resourceclaims": "claims", "resourceclaim": "claims",
	"slices": "slices", "slice": "slices", "resourceslices": "slices", "resourceslice": "slices",
}

// kindNames lists the canonical kinds, for errors and completion.
var kindNames = []string{"resources", "devices", "plugins", "pods", "claims", "slices"}

// NewCommand returns the "get" command.
func NewCommand(env *cli.Env) *cobra.Command {
	var root, socket, prSocket, format, kubeconfig, namespace string
	cmd := &cobra.Command{
		Use:   "get resources|devices|plugins|pods|claims|slices [NAME...]",
		Short: "Show the resources, devices, plugins, pods or DRA claims and slices of a node",
		Long: `Show what a running dpkit kubelet (or dpkit up) knows: resources, devices and
plugins come from its admin API (<root>/dpkit/admin.sock). Pods come from the
PodResources API (<root>/pod-resources/kubelet.sock), so "get pods" also works
on the root of a dpkit node or of a real kubelet (/var/lib/kubelet).

Names after the kind show only those: resources, plugins and devices by
resource name ("get devices example.com/foo"), pods by name or
NAMESPACE/NAME. Rows are sorted naturally (dev-2 before dev-10). With
nothing to show, "No resources found" goes to standard error and the exit
status is 0; a name that is not there is an error (exit status 1).

Without --root, the root is $DPKIT_ROOT, else that of the last dpkit up or
dpkit kubelet started while it still runs, else /var/lib/kubelet.

The PodResources API has no device health. "get pods" shows each device's
health (Healthy, Unhealthy or Unknown) as the pod's status reports it
(allocatedResourcesStatus): with --kubeconfig from the pods' status in the API
server (a dpkit node, or a kubelet with ResourceHealthStatus, on by default
since 1.36), otherwise from the admin API of a dpkit kubelet when the root has
one; "-" where neither knows.

Claims and slices are DRA's (resource.k8s.io/v1). With --kubeconfig, "get
claims" lists the ResourceClaims of the API server (with --namespace, those
of one namespace): their state (pending, allocated, reserved for pods, or
prepared when --root or --pod-resources-socket names a node whose PodResources
API lists them), the node of the allocation, the devices (driver/pool/device)
and the pods they are reserved for. Without --kubeconfig it lists the claims
the node of the root has prepared, from its PodResources API (dpkit kubelet,
dpkit up, dpkit node or a kubelet), with the CDI devices of each device.
"get slices" lists the ResourceSlices of the API server and needs
--kubeconfig: slices live only there.`,
		Example: `  dpkit get resources --root /tmp/kubelet
  dpkit get devices example.com/foo -o yaml
  dpkit get pods demo
  dpkit get pods --root /var/lib/kubelet -o json
  dpkit get pods --root /var/lib/dpkit/vn1 --kubeconfig k.conf
  dpkit get claims --kubeconfig k.conf -n default
  dpkit get claims --root /var/lib/kubelet -o yaml
  dpkit get slices --kubeconfig k.conf`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cli.Exit(2, errors.New("name what to get: resources, devices, plugins, pods, claims or slices"))
			}
			if _, ok := kinds[strings.ToLower(args[0])]; !ok {
				return cli.Exit(2, fmt.Errorf("unknown kind %q; use resources, devices, plugins, pods, claims or slices", args[0]))
			}
			return nil
		},
		ValidArgsFunction: func(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 0 {
				return kindNames, cobra.ShellCompDirectiveNoFileComp
			}
			r := emulator.ChooseRoot(root, cmd.Flags().Changed("root"), env.Var)
			return completeNames(cmp.Or(socket, emulator.AdminSocket(r.Dir)), kinds[strings.ToLower(args[0])]), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, names := kinds[strings.ToLower(args[0])], args[1:]
			if cmd.Flags().Changed("root") && root == "" {
				return cli.Exit(2, errors.New("--root must not be empty; leave it out to use $DPKIT_ROOT or the last dpkit up's root"))
			}
			if namespace != "" && kind != "pods" && kind != "claims" {
				return cli.Exit(2, fmt.Errorf("--namespace: %s have no namespace; use it with pods or claims", kind))
			}
			r := emulator.ChooseRoot(root, cmd.Flags().Changed("root"), env.Var)
			if socket == "" {
				socket = emulator.AdminSocket(r.Dir)
			}
			if kind == "claims" || kind == "slices" {
				named := cmd.Flags().Changed("root") || prSocket != ""
				if prSocket == "" {
					prSocket = podresources.SocketPath(r.Dir)
				}
				q := draQuery{kind: kind, format: format, namespace: namespace, names: names, prSocket: prSocket, nodeNamed: named}
				if kubeconfig != "" {
					if env.Cluster == nil {
						return errors.New("--kubeconfig needs the API server clients of dpkit-cluster")
					}
					reader, err := env.Cluster.DRA(kubeconfig)
					if err != nil {
						return cli.Exit(2, err)
					}
					q.api = reader
				} else if kind == "slices" {
					return cli.Exit(2, errors.New("slices: ResourceSlices live in the API server; give --kubeconfig"))
				}
				return r.Explain(runDRA(cmd.Context(), env, q))
			}
			if kind == "pods" {
				if prSocket == "" {
					prSocket = podresources.SocketPath(r.Dir)
				}
				var health healthSource
				switch {
				case kubeconfig != "":
					// dpkit hands this command line to dpkit-cluster,
					// which has the API server clients (Env.Cluster).
					if env.Cluster == nil {
						return errors.New("--kubeconfig needs the API server clients of dpkit-cluster")
					}
					getHealth, err := env.Cluster.PodHealth(kubeconfig)
					if err != nil {
						return cli.Exit(2, err)
					}
					health = statusHealth(getHealth)
				default:
					if _, err := os.Stat(socket); err == nil {
						c := emulator.NewClient(socket)
						defer c.Close()
						health = adminHealth(c)
					}
				}
				return r.Explain(runPods(cmd.Context(), env, prSocket, format, health, namespace, names))
			}
			c := emulator.NewClient(socket)
			defer c.Close()
			return r.Explain(runKind(cmd.Context(), env, c, kind, format, names))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&root, "root", "", "root directory of the dpkit kubelet, dpkit node or kubelet (default: $DPKIT_ROOT, else the last dpkit up's or dpkit kubelet's while it runs, else "+emulator.DefaultRoot+")")
	fl.StringVar(&socket, "admin-socket", "", "admin API socket, for resources, devices and plugins (default <root>/dpkit/admin.sock)")
	fl.StringVar(&prSocket, "pod-resources-socket", "", "PodResources API socket, for pods and claims (default <root>/pod-resources/kubelet.sock)")
	output.AddFlag(cmd, &format)
	fl.StringVarP(&namespace, "namespace", "n", "", "pods and claims: only those of this namespace (default: every namespace)")
	fl.StringVar(&kubeconfig, "kubeconfig", "", "pods: read device health from the pods' status through the API server with this kubeconfig (default: from the admin API when the root has one); claims and slices: read them from that API server")
	_ = cmd.MarkFlagDirname("root")
	cmd.SetFlagErrorFunc(cli.FlagError)
	return cmd
}

// completionTimeout bounds asking the emulator for names to complete.
const completionTimeout = 5 * time.Second

// completeNames returns the names of kind the emulator at socket knows,
// for shell completion; none when it does not answer.
func completeNames(socket, kind string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	c := emulator.NewClient(socket)
	defer c.Close()
	var out []string
	switch kind {
	case "claims", "slices":
		return nil
	case "pods":
		pods, _ := c.Pods(ctx)
		for _, p := range pods {
			out = append(out, p.Name)
		}
	default:
		rs, _ := c.Resources(ctx)
		for _, r := range rs {
			out = append(out, r.Name)
		}
	}
	natural.Sort(out)
	return slices.Compact(out)
}

// show writes v to env.Out in format, or, when the table would have no
// rows (n is 0), says "No resources found" on env.Err as kubectl does.
// missing are the names asked for that are not there: they are an error
// after what was found is shown.
func show(env *cli.Env, format string, v any, n int, table func(*tabwriter.Writer), what string, missing []string) error {
	if n > 0 || format != output.Table {
		if err := output.Write(env.Out, format, v, func(t *tabwriter.Writer) error {
			table(t)
			return nil
		}); err != nil {
			return err
		}
	} else if len(missing) == 0 {
		if _, err := fmt.Fprintln(env.Err, "No resources found"); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		quoted := make([]string, len(missing))
		for i, m := range missing {
			quoted[i] = strconv.Quote(m)
		}
		return fmt.Errorf("%s %s not found", what, strings.Join(quoted, ", "))
	}
	return nil
}

// filter keeps the items whose key is one of names (all of them when
// names is empty) and returns the names no item has.
func filter[T any](items []T, names []string, key func(T) string) ([]T, []string) {
	if len(names) == 0 {
		return items, nil
	}
	var kept []T
	found := map[string]bool{}
	for _, it := range items {
		if slices.Contains(names, key(it)) {
			kept = append(kept, it)
			found[key(it)] = true
		}
	}
	var missing []string
	for _, n := range names {
		if !found[n] && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	return kept, missing
}

// runKind fetches kind ("resources", "devices" or "plugins") from the admin
// API, keeps those names lists (by resource name; all when empty), and
// writes them to env.Out in format ("table", "json" or "yaml").
func runKind(ctx context.Context, env *cli.Env, c *emulator.Client, kind, format string, names []string) error {
	switch kind {
	case "resources":
		rs, err := c.Resources(ctx)
		if err != nil {
			return err
		}
		slices.SortFunc(rs, func(a, b emulator.Resource) int { return natural.Compare(a.Name, b.Name) })
		rs, missing := filter(rs, names, func(r emulator.Resource) string { return r.Name })
		return show(env, format, orEmpty(rs), len(rs), func(t *tabwriter.Writer) {
			fmt.Fprintln(t, "NAME\tCAPACITY\tALLOCATABLE\tIN USE\tCONNECTED")
			for _, r := range rs {
				fmt.Fprintf(t, "%s\t%d\t%d\t%d\t%t\n", r.Name, r.Capacity, r.Allocatable, r.InUse, r.Connected)
			}
		}, "resource", missing)
	case "devices":
		ds, err := c.Devices(ctx)
		if err != nil {
			return err
		}
		sortDevices(ds)
		ds, missing := filter(ds, names, func(d emulator.Device) string { return d.Resource })
		return show(env, format, orEmpty(ds), len(ds), func(t *tabwriter.Writer) { writeDevices(t, ds) }, "resource", missing)
	case "plugins":
		ps, err := c.Plugins(ctx)
		if err != nil {
			return err
		}
		slices.SortFunc(ps.Registered, func(a, b pluginwatcher.Plugin) int {
			return cmp.Or(natural.Compare(a.Name, b.Name), strings.Compare(a.SocketPath, b.SocketPath))
		})
		var missing []string
		if len(names) > 0 {
			ps.Registered, missing = filter(ps.Registered, names, func(p pluginwatcher.Plugin) string { return p.Name })
			ps.Failing = nil // failing plugins have no name yet
		}
		ps.Registered = orEmpty(ps.Registered)
		return show(env, format, ps, len(ps.Registered)+len(ps.Failing), func(t *tabwriter.Writer) {
			fmt.Fprintln(t, "SOCKET\tTYPE\tNAME\tENDPOINT\tVERSIONS\tSTATUS")
			for _, p := range ps.Registered {
				fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\tregistered\n", p.SocketPath, p.Type, p.Name, p.Endpoint, strings.Join(p.Versions, ","))
			}
			for _, f := range ps.Failing {
				fmt.Fprintf(t, "%s\t-\t-\t-\t-\tfailing (%d): %s\n", f.SocketPath, f.Failures, f.LastError)
			}
		}, "plugin", missing)
	}
	return fmt.Errorf("unknown kind %q", kind)
}

// orEmpty returns s, or an empty slice for nil: JSON shows [] rather
// than null.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// sortDevices sorts devices by resource, then ID, naturally.
func sortDevices(ds []emulator.Device) {
	slices.SortFunc(ds, func(a, b emulator.Device) int {
		return cmp.Or(natural.Compare(a.Resource, b.Resource), natural.Compare(a.ID, b.ID))
	})
}

// writeDevices writes the table of devices. IDs are shown as output.ID
// does: quoted when they have control characters or path separators.
func writeDevices(t io.Writer, ds []emulator.Device) {
	fmt.Fprintln(t, "RESOURCE\tID\tHEALTHY\tNUMA\tPOD")
	for _, d := range ds {
		fmt.Fprintf(t, "%s\t%s\t%t\t%s\t%s\n", d.Resource, output.ID(d.ID), d.Healthy, joinInts(d.NUMANodes), orDash(cmp.Or(d.Pod, d.PodUID)))
	}
}

// podsTimeout bounds connecting to the PodResources API and listing.
const podsTimeout = 10 * time.Second

// runPods lists the pods and their devices from the PodResources API at
// socket and writes them to env.Out in format: those of namespace (all
// when empty) named in names (NAME or NAMESPACE/NAME; all when empty).
// Containers list their devices grouped by resource, IDs sorted, with the
// NUMA nodes they sit on and, when health is not nil, their health.
func runPods(ctx context.Context, env *cli.Env, socket string, format string, health healthSource, namespace string, names []string) error {
	if _, err := os.Stat(socket); err != nil {
		return fmt.Errorf("PodResources API at %s: %w (is dpkit kubelet, dpkit up, dpkit node or a kubelet running with this --root?)", socket, err)
	}
	ctx, cancel := context.WithTimeout(ctx, podsTimeout)
	defer cancel()
	client, closer, err := prclient.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer closer.Close()
	resp, err := client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return fmt.Errorf("PodResources List at %s: %w", socket, err)
	}
	pods, missing := selectPods(podsFromList(resp), namespace, names)
	if health != nil {
		if err := health(ctx, pods); err != nil {
			return fmt.Errorf("device health: %w", err)
		}
	}
	return show(env, format, pods, len(pods), func(t *tabwriter.Writer) { writePods(t, pods) }, "pod", missing)
}

// selectPods keeps the pods of namespace (all when empty) that names
// names, by name or NAMESPACE/NAME (all when names is empty), and returns
// the names no pod has.
func selectPods(pods []podRow, namespace string, names []string) ([]podRow, []string) {
	kept := []podRow{}
	found := map[string]bool{}
	for _, p := range pods {
		if namespace != "" && p.Namespace != namespace {
			continue
		}
		match := len(names) == 0
		for _, n := range names {
			if n == p.Name || n == p.Namespace+"/"+p.Name {
				match, found[n] = true, true
			}
		}
		if match {
			kept = append(kept, p)
		}
	}
	var missing []string
	for _, n := range names {
		if !found[n] && !slices.Contains(missing, n) {
			missing = append(missing, n)
		}
	}
	return kept, missing
}

// writePods writes the table of pods. Device IDs are shown as output.ID
// does: quoted when they have control characters or path separators.
func writePods(t io.Writer, pods []podRow) {
	fmt.Fprintln(t, "NAMESPACE\tNAME\tCONTAINER\tRESOURCE\tDEVICES\tHEALTH\tNUMA")
	for _, p := range pods {
		for _, c := range p.Containers {
			if len(c.Devices) == 0 {
				fmt.Fprintf(t, "%s\t%s\t%s\t-\t-\t-\t-\n", p.Namespace, p.Name, c.Name)
			}
			for _, d := range c.Devices {
				fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Namespace, p.Name, c.Name, d.Resource, output.IDs(d.DeviceIDs), d.healthColumn(), joinInts(d.NUMANodes))
			}
		}
	}
}

// healthColumn lists the devices' health in DeviceIDs order, "-" for a
// device whose health is not known, or "-" alone when none is.
func (d deviceGroup) healthColumn() string {
	if len(d.Health) == 0 {
		return "-"
	}
	out := make([]string, len(d.DeviceIDs))
	for i, id := range d.DeviceIDs {
		out[i] = cmp.Or(d.Health[id], "-")
	}
	return strings.Join(out, ",")
}

// healthSource fills in the Health of pods' devices from a source that
// knows it.
type healthSource func(ctx context.Context, pods []podRow) error

// adminHealth reads device health from the admin API of a dpkit kubelet:
// the health its pods' status would report.
func adminHealth(c *emulator.Client) healthSource {
	return func(ctx context.Context, pods []podRow) error {
		admitted, err := c.Pods(ctx)
		if err != nil {
			return err
		}
		byPod := map[string]map[string]map[string]string{} // namespace/name -> container/resource -> ID -> health
		for _, p := range admitted {
			m := map[string]map[string]string{}
			for _, c := range p.Containers {
				for _, a := range c.Devices {
					m[c.Name+"\x00"+a.Resource] = a.Health
				}
			}
			byPod[p.Namespace+"/"+p.Name] = m
		}
		for _, p := range pods {
			for _, c := range p.Containers {
				for i := range c.Devices {
					c.Devices[i].Health = pick(byPod[p.Namespace+"/"+p.Name][c.Name+"\x00"+c.Devices[i].Resource], c.Devices[i].DeviceIDs)
				}
			}
		}
		return nil
	}
}

// statusHealth reads device health from the pods' status in the API
// server (allocatedResourcesStatus of containers and init containers). A
// pod the API server does not have is left without health.
func statusHealth(getHealth cli.PodHealthGetter) healthSource {
	return func(ctx context.Context, pods []podRow) error {
		for _, p := range pods {
			health, err := getHealth(ctx, p.Namespace, p.Name)
			if err != nil {
				return err
			}
			for _, c := range p.Containers {
				for i := range c.Devices {
					c.Devices[i].Health = pick(health[c.Name][c.Devices[i].Resource], c.Devices[i].DeviceIDs)
				}
			}
		}
		return nil
	}
}

// pick returns the health of ids found in health, nil when none is.
func pick(health map[string]string, ids []string) map[string]string {
	var out map[string]string
	for _, id := range ids {
		if h, ok := health[id]; ok {
			if out == nil {
				out = map[string]string{}
			}
			out[id] = h
		}
	}
	return out
}

// podRow is one pod as the PodResources API lists it.
type podRow struct {
	Namespace  string         `json:"namespace"`
	Name       string         `json:"name"`
	Containers []containerRow `json:"containers,omitempty"`
}

// containerRow is one container of a podRow and its devices.
type containerRow struct {
	Name    string        `json:"name"`
	Devices []deviceGroup `json:"devices,omitempty"`
}

// deviceGroup is a container's devices of one resource.
type deviceGroup struct {
	Resource  string   `json:"resource"`
	DeviceIDs []string `json:"deviceIDs"`
	NUMANodes []int64  `json:"numaNodes,omitempty"`
	// Health is each device's health by ID (Healthy, Unhealthy or
	// Unknown) where a Health source knows it.
	Health map[string]string `json:"health,omitempty"`
}

// podsFromList turns a List answer into Pods sorted by namespace and name.
// The kubelet lists a container's devices one entry per device and NUMA
// node; they are grouped by resource here.
func podsFromList(resp *podresourcesv1.ListPodResourcesResponse) []podRow {
	pods := []podRow{}
	for _, p := range resp.GetPodResources() {
		pod := podRow{Namespace: p.GetNamespace(), Name: p.GetName()}
		for _, c := range p.GetContainers() {
			ctr := containerRow{Name: c.GetName()}
			byRes := map[string]*deviceGroup{}
			var order []string
			for _, d := range c.GetDevices() {
				r := d.GetResourceName()
				g := byRes[r]
				if g == nil {
					g = &deviceGroup{Resource: r}
					byRes[r] = g
					order = append(order, r)
				}
				g.DeviceIDs = append(g.DeviceIDs, d.GetDeviceIds()...)
				for _, n := range d.GetTopology().GetNodes() {
					g.NUMANodes = append(g.NUMANodes, n.GetID())
				}
			}
			natural.Sort(order)
			for _, r := range order {
				g := byRes[r]
				natural.Sort(g.DeviceIDs)
				g.DeviceIDs = slices.Compact(g.DeviceIDs)
				slices.Sort(g.NUMANodes)
				g.NUMANodes = slices.Compact(g.NUMANodes)
				ctr.Devices = append(ctr.Devices, *g)
			}
			pod.Containers = append(pod.Containers, ctr)
		}
		pods = append(pods, pod)
	}
	slices.SortFunc(pods, func(a, b podRow) int {
		return cmp.Or(natural.Compare(a.Namespace, b.Namespace), natural.Compare(a.Name, b.Name))
	})
	return pods
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
